/* Per-exec cost: N times posix_spawn + waitpid of a program (default /bin/true, 2,000 times).
 * The environment is passed through, so under LD_PRELOAD every child loads the shim. */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

extern char **environ;

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000;
    char *prog = argc > 2 ? argv[2] : "/bin/true";
    char *args[] = {prog, NULL};
    for (long i = 0; i < n; i++) {
        pid_t pid;
        int rc = posix_spawn(&pid, prog, NULL, NULL, args, environ);
        if (rc != 0) {
            fprintf(stderr, "posix_spawn: %d\n", rc);
            return 1;
        }
        int status;
        if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "child failed\n");
            return 1;
        }
    }
    return 0;
}
