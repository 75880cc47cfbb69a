/* The first change of a process is made by its threads while the main thread forks at once:
 * a child forked while another thread is in the middle of the shim's first-use setup must not
 * wait for a setup that will never finish in the child. Run it many times (fresh images). */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void *first_change(void *arg) {
    char nm[32];
    snprintf(nm, sizeof nm, "t%ld-%d", (long)arg, (int)getpid());
    int fd = open(nm, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0) close(fd);
    unlink(nm);
    return NULL;
}

int main(void) {
    pthread_t t[4];
    for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, first_change, (void *)i);
    for (int i = 0; i < 12; i++) {
        pid_t p = fork();
        if (p == 0) {
            char nm[32];
            snprintf(nm, sizeof nm, "c%d-%d", i, (int)getpid());
            int fd = open(nm, O_WRONLY | O_CREAT, 0644);
            if (fd >= 0) close(fd);
            unlink(nm);
            _exit(0);
        }
        if (p > 0) waitpid(p, NULL, 0);
    }
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    return 0;
}
