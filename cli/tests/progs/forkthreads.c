/* Threads mutate files while the main thread forks (and vforks + execs, and posix_spawns):
 * a lock held by a thread at fork time must never wedge the child. */
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;
static volatile int stop;

static void *churn(void *arg) {
    long id = (long)arg;
    char a[64], b[64];
    for (long i = 0; !stop; i++) {
        snprintf(a, sizeof a, "t%ld-%ld", id, i % 20);
        snprintf(b, sizeof b, "t%ld-%ld.moved", id, i % 20);
        int fd = open(a, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) { (void)!write(fd, "abc", 3); close(fd); }
        rename(a, b);
        unlink(b);
    }
    return NULL;
}

int main(void) {
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, churn, (void *)i);
    for (int i = 0; i < 40; i++) {
        pid_t p = fork();
        if (p == 0) {
            char nm[32];
            snprintf(nm, sizeof nm, "child-%d", i);
            int fd = open(nm, O_WRONLY | O_CREAT, 0644);
            if (fd >= 0) close(fd);
            _exit(0);
        }
        waitpid(p, NULL, 0);
        char nm[32];
        snprintf(nm, sizeof nm, "vf-%d", i);
        int fd = open(nm, O_WRONLY | O_CREAT, 0644);
        if (fd >= 0) close(fd);
        p = vfork();
        if (p == 0) { execl("/bin/rm", "rm", "-f", nm, (char *)NULL); _exit(127); }
        waitpid(p, NULL, 0);
        char sp[32];
        snprintf(sp, sizeof sp, "sp-%d", i);
        fd = open(sp, O_WRONLY | O_CREAT, 0644);
        if (fd >= 0) close(fd);
        char *argv[] = { "rm", "-f", sp, NULL };
        if (posix_spawn(&p, "/bin/rm", NULL, NULL, argv, environ) == 0) waitpid(p, NULL, 0);
    }
    stop = 1;
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    puts("done");
    return 0;
}
