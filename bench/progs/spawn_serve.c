/* Whole spawns from a long-lived parent, a block at a time on request: `spawn_serve [--fork]`
 * reads a number N per line on standard input, spawns /bin/true N times in a row (posix_spawn
 * + waitpid; with --fork, fork + execve in the child + waitpid, as a shell runs a command, where
 * the child's exec hook journals the exec), its own environment passed on, so that the children
 * of a server started under LD_PRELOAD load the same library, and writes the block's time per
 * spawn, in microseconds, on standard output. It ends at the end of its input.
 *
 * Several servers, one per library, asked in turn for blocks a few milliseconds apart see the
 * same machine: the difference of a pair is precise to a few microseconds, where separate runs
 * of a few hundred spawns each, a process per library, differ by tens from one round to the
 * next. A server's own start (under the shim: its store opened at its first exec record) is
 * outside every block. */
#include <errno.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    char line[64];
    char *args[] = {"/bin/true", NULL};
    int forks = argc > 1 && strcmp(argv[1], "--fork") == 0;
    if (argc > 1 && !forks) {
        fprintf(stderr, "spawn_serve: usage: spawn_serve [--fork]\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof line, stdin)) {
        long n = atol(line);
        if (n < 1) {
            fprintf(stderr, "spawn_serve: a block is a positive number of spawns, not %s", line);
            return 2;
        }
        double t0 = now_us();
        for (long i = 0; i < n; i++) {
            pid_t pid;
            int status;
            int rc = 0;
            if (forks) {
                pid = fork();
                if (pid == 0) {
                    execve(args[0], args, environ);
                    _exit(127);
                }
                if (pid < 0) rc = errno;
            } else {
                rc = posix_spawn(&pid, args[0], NULL, NULL, args, environ);
            }
            if (rc != 0) {
                fprintf(stderr, "spawn_serve: %s: %s\n", forks ? "fork" : "posix_spawn", strerror(rc));
                return 1;
            }
            if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "spawn_serve: /bin/true failed\n");
                return 1;
            }
        }
        printf("%.2f\n", (now_us() - t0) / n);
    }
    return 0;
}
