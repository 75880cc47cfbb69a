/* posix_spawn of a program named relative to the directory a file action changes to: runs
 * `./mk in-sub` in `sub` (posix_spawn_file_actions_addchdir_np, glibc 2.29) with a pipe as its
 * standard input, written only once posix_spawn has returned (so the child cannot have ended
 * before the spawning process looked at it); then `./mk here` with no file actions at all,
 * from the working directory. */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>

extern char **environ;

static int run(const posix_spawn_file_actions_t *fa, char *arg, int go) {
    char *argv[] = {"./mk", arg, NULL};
    pid_t pid;
    int status;
    int e = posix_spawn(&pid, "./mk", fa, NULL, argv, environ);
    if (e) {
        fprintf(stderr, "posix_spawn: %d\n", e);
        return 1;
    }
    if (go >= 0 && (write(go, "go\n", 3) != 3 || close(go))) return 1;
    return waitpid(pid, &status, 0) != pid || status != 0;
}

int main(void) {
    int p[2];
    posix_spawn_file_actions_t fa;
    if (pipe(p) || posix_spawn_file_actions_init(&fa) || posix_spawn_file_actions_addchdir_np(&fa, "sub") ||
        posix_spawn_file_actions_adddup2(&fa, p[0], 0) || posix_spawn_file_actions_addclose(&fa, p[1]))
        return 1;
    if (run(&fa, "in-sub", p[1])) return 1;
    close(p[0]);
    posix_spawn_file_actions_destroy(&fa);
    return run(NULL, "here", -1);
}
