/* A program whose signal handler writes files while its main loop allocates and writes:
 * the shim must neither deadlock nor corrupt the heap, and must journal the handler's files.
 * Usage: sigwrite [MS [sigaction|signal|sigset [handler-only]]]: how the handler is installed;
 * handler-only: main never touches a file, so the handler makes the process's first change
 * (the shim sets its store up there) and every later one, all while main is in malloc/free. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

static volatile sig_atomic_t n;

static void on_alarm(int sig) {
    (void)sig;
    char name[32] = "sig-";
    int k = n++, len = 4, i = 0;
    char tmp[16];
    do { tmp[i++] = '0' + k % 10; k /= 10; } while (k);
    while (i) name[len++] = tmp[--i];
    name[len] = 0;
    int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) { (void)!write(fd, "x", 1); close(fd); }
}

int main(int argc, char **argv) {
    long ms = argc > 1 ? atol(argv[1]) : 1500;
    const char *how = argc > 2 ? argv[2] : "sigaction";
    int main_writes = !(argc > 3 && !strcmp(argv[3], "handler-only"));
    if (!strcmp(how, "signal")) {
        signal(SIGALRM, on_alarm); /* glibc: BSD semantics, SA_RESTART */
    } else if (!strcmp(how, "sigset")) {
        sigset(SIGALRM, on_alarm); /* no SA_RESTART: an interrupted fopen just fails */
    } else {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_alarm;
        sa.sa_flags = SA_RESTART;
        sigaction(SIGALRM, &sa, NULL);
    }
    struct itimerval it = { {0, 300}, {0, 300} };
    setitimer(ITIMER_REAL, &it, NULL);
    struct timeval start, now;
    gettimeofday(&start, NULL);
    long iters = 0;
    do {
        void *p[32];
        for (int i = 0; i < 32; i++) p[i] = malloc(16 + i * 37);
        for (int i = 0; i < 32; i++) free(p[i]);
        if (main_writes && iters % 20 == 0) {
            char nm[32];
            snprintf(nm, sizeof nm, "main-%ld", iters % 500);
            FILE *f = fopen(nm, "w");
            if (f) { fputs("m", f); fclose(f); }
        }
        iters++;
        gettimeofday(&now, NULL);
    } while ((now.tv_sec - start.tv_sec) * 1000 + (now.tv_usec - start.tv_usec) / 1000 < ms);
    memset(&it, 0, sizeof it);
    setitimer(ITIMER_REAL, &it, NULL);
    printf("done signals=%d\n", (int)n);
    return 0;
}
