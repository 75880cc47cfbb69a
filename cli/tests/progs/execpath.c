/* execvp and execlp along PATH, for each name given: a child tries it and says what happened
 * (the program's own output, or the errno the exec failed with). The same output with and
 * without the supervisor shows the shim's own PATH search (its execs marked) behaves as
 * glibc's. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        fflush(stdout);
        pid_t p = fork();
        if (p == 0) {
            if (i % 2)
                execlp(argv[i], argv[i], "arg1", (char *)NULL);
            else {
                char *args[] = {argv[i], "arg1", NULL};
                execvp(argv[i], args);
            }
            printf("%s: %s\n", argv[i], strerror(errno));
            fflush(stdout);
            _exit(111);
        }
        int st;
        waitpid(p, &st, 0);
        printf("%s: exit %d\n", argv[i], WEXITSTATUS(st));
    }
    return 0;
}
