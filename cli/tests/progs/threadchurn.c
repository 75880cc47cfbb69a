/* A process that runs a short thread per task, as thread-per-request servers and test runners
 * do: N threads (argv[1], default 2000) one after the other, each creating a file of its own
 * (a hook, so each thread gets an arena). Prints its address space (VmSize) and anonymous
 * resident memory (RssAnon), in KiB, after 20 such threads and at the end: "warm V A end V A".
 * A thread's memory that outlives the thread shows as the gap. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *task(void *arg) {
    char name[32];
    snprintf(name, sizeof name, "t%ld", (long)arg);
    int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "x", 1) != 1 || close(fd) != 0) return (void *)1;
    return NULL;
}

static void report(const char *when) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long size = -1, anon = -1;
    while (f && fgets(line, sizeof line, f)) {
        sscanf(line, "VmSize: %ld kB", &size);
        sscanf(line, "RssAnon: %ld kB", &anon);
    }
    if (f) fclose(f);
    printf("%s %ld %ld ", when, size, anon);
}

static int run(long from, long to) {
    for (long i = from; i < to; i++) {
        pthread_t t;
        void *rc;
        if (pthread_create(&t, NULL, task, (void *)i) || pthread_join(t, &rc) || rc) return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 2000;
    if (run(0, 20)) return 1;
    report("warm");
    if (run(20, 20 + n)) return 1;
    report("end");
    printf("\n");
    return 0;
}
