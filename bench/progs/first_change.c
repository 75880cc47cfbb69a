/* CHANGE: what journaling costs a process, timed from inside it, its start-up left out.
 * `first_change DIR N` creates DIR/f0 (the process's first change: under the shim, its store
 * opened and mapped, the directory looked at, the first record), then DIR/f1..DIR/fN (one
 * creation each: a record), then changes DIR/f0's times N times (`utime`), and prints the
 * microseconds of the first creation, of each further one and of each `utime`, in that order.
 * Each creation is an open with O_CREAT|O_TRUNC and a close, as a shell's redirection or
 * `touch` makes it. DIR must exist; its files must not. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <utime.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int create(const char *dir, long i) {
    char path[4096];
    snprintf(path, sizeof path, "%s/f%ld", dir, i);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        perror(path);
        return -1;
    }
    return close(fd);
}

int main(int argc, char **argv) {
    if (argc != 3 || atol(argv[2]) < 1) {
        fprintf(stderr, "usage: first_change DIR N (N >= 1)\n");
        return 2;
    }
    const char *dir = argv[1];
    long n = atol(argv[2]);
    char first[4096];
    snprintf(first, sizeof first, "%s/f0", dir);
    double t0 = now_us();
    if (create(dir, 0) != 0) return 1;
    double t1 = now_us();
    for (long i = 1; i <= n; i++)
        if (create(dir, i) != 0) return 1;
    double t2 = now_us();
    for (long i = 0; i < n; i++) {
        if (utime(first, NULL) != 0) {
            perror(first);
            return 1;
        }
    }
    double t3 = now_us();
    printf("%.1f %.2f %.2f\n", t1 - t0, (t2 - t1) / n, (t3 - t2) / n);
    return 0;
}
