/* A vfork child creates a file (close-on-exec) and execs; the parent then opens a file that
 * existed before, gets the same descriptor number, and changes its mode and times through it.
 * The child shares the parent's memory but not its descriptors: nothing the child's hooks
 * remember about its descriptors may make the parent's changes go unjournaled. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
    pid_t pid = vfork();
    if (pid == 0) {
        int fd = open("child-made", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) _exit(2);
        char *argv[] = { "true", NULL };
        execvp("true", argv);
        _exit(3);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
        fprintf(stderr, "child failed\n");
        return 2;
    }
    int fd = open("existing", O_RDONLY);
    if (fd != 3) { fprintf(stderr, "got descriptor %d, not the child's 3\n", fd); return 3; }
    struct timespec t[2] = { { 1000000000, 0 }, { 1000000000, 0 } };
    if (fchmod(fd, 0600) || futimens(fd, t)) { perror("fchmod/futimens"); return 4; }
    printf("ok\n");
    return 0;
}
