/* A long-lived process that starts many short children, as make, ninja or an agent's harness
 * does: posix_spawn, posix_spawnp, system and popen, ROUNDS times each (argv[1], default 300),
 * one kind after the other (a call of another kind in between could hide a leak, and so could
 * one that gives memory back at its end). Prints its anonymous resident memory (RssAnon, KiB)
 * after one call of each kind, and the most it had at the end of any kind's loop: "warm N
 * peak M". A hook that leaves memory behind per call shows as the gap. */
#define _GNU_SOURCE
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

static long rss_anon(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "RssAnon: %ld kB", &kb) == 1) break;
    }
    if (f) fclose(f);
    return kb;
}

static int one(int kind) {
    char *argv[] = {"true", NULL};
    pid_t pid;
    int status;
    FILE *p;
    switch (kind) {
    case 0: return posix_spawn(&pid, "/bin/true", NULL, NULL, argv, environ) || waitpid(pid, &status, 0) != pid;
    case 1: return posix_spawnp(&pid, "true", NULL, NULL, argv, environ) || waitpid(pid, &status, 0) != pid;
    case 2: return system("true") != 0;
    default: p = popen("true", "r"); return !p || pclose(p) != 0;
    }
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 300;
    for (int kind = 0; kind < 4; kind++) {
        if (one(kind)) return 1 + kind;
    }
    long warm = rss_anon(), peak = warm;
    for (int kind = 0; kind < 4; kind++) {
        for (long i = 1; i < rounds; i++) {
            if (one(kind)) return 1 + kind;
        }
        long now = rss_anon();
        peak = now > peak ? now : peak;
    }
    printf("warm %ld peak %ld\n", warm, peak);
    return 0;
}
