/* The child's side of a spawn, paired block by block: `spawn_rotate CYCLES BLOCK LIB...` runs
 * CYCLES cycles; each cycle spawns /bin/true BLOCK times in a row with each LIB as the child's
 * LD_PRELOAD ("-" for none), the LIBs in an order that rotates every cycle, and times each
 * block (posix_spawn + waitpid each time). The spawner itself loads nothing (run it without
 * LD_PRELOAD), so what differs between the blocks of a cycle is only what the children pay to
 * load the library, run its constructor and exit.
 *
 * Runs of a few hundred spawns each, taken in turn, see the machine's speed drift between
 * them; blocks taken a few milliseconds apart do not, so the difference of a pair is precise to
 * a microsecond or two where the runs' difference is not precise to twenty. Blocks rather than
 * single spawns: a spawn's cost depends on what ran just before it (caches, the page cache's
 * state), and single spawns rotated among several libraries gave the same library +9 or +20 us
 * depending on which others were in the rotation; in a block, as in a real loop, a library's
 * spawns follow its own.
 *
 * Prints one line per LIB: its label, the median time of a spawn in us, and the median over
 * cycles of (its spawn - the first LIB's spawn of the same cycle) in us, per spawn. */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

#define MAX_LIBS 8

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *xs, long n) {
    qsort(xs, n, sizeof *xs, by_value);
    return n % 2 ? xs[n / 2] : (xs[n / 2 - 1] + xs[n / 2]) / 2;
}

/* The spawner's environment with LD_PRELOAD replaced by `lib` (removed for "-"). */
static char **env_with(const char *lib) {
    long n = 0;
    while (environ[n]) n++;
    char **env = calloc(n + 2, sizeof *env);
    if (!env) return NULL;
    long k = 0;
    for (long i = 0; i < n; i++)
        if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0) env[k++] = environ[i];
    if (strcmp(lib, "-") != 0) {
        size_t len = strlen(lib) + 12;
        char *var = malloc(len);
        if (!var) return NULL;
        snprintf(var, len, "LD_PRELOAD=%s", lib);
        env[k++] = var;
    }
    env[k] = NULL;
    return env;
}

int main(int argc, char **argv) {
    if (argc < 4 || argc - 3 > MAX_LIBS) {
        fprintf(stderr, "usage: spawn_rotate CYCLES BLOCK LIB... (at most %d; - for none)\n", MAX_LIBS);
        return 2;
    }
    long cycles = atol(argv[1]), block = atol(argv[2]);
    int libs = argc - 3;
    if (cycles < 1 || block < 1) {
        fprintf(stderr, "spawn_rotate: CYCLES and BLOCK must be positive numbers\n");
        return 2;
    }
    char **envs[MAX_LIBS];
    double *times[MAX_LIBS], *diffs[MAX_LIBS];
    for (int l = 0; l < libs; l++) {
        envs[l] = env_with(argv[l + 3]);
        times[l] = malloc(cycles * sizeof(double));
        diffs[l] = malloc(cycles * sizeof(double));
        if (!envs[l] || !times[l] || !diffs[l]) {
            fprintf(stderr, "spawn_rotate: out of memory\n");
            return 1;
        }
    }
    char *args[] = {"/bin/true", NULL};
    for (long c = 0; c < cycles; c++) {
        for (int j = 0; j < libs; j++) {
            int l = (int)((j + c) % libs);
            pid_t pid;
            int status;
            double t0 = now_us();
            for (long b = 0; b < block; b++) {
                int rc = posix_spawn(&pid, args[0], NULL, NULL, args, envs[l]);
                if (rc != 0) {
                    fprintf(stderr, "spawn_rotate: posix_spawn: %s\n", strerror(rc));
                    return 1;
                }
                if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                    fprintf(stderr, "spawn_rotate: /bin/true failed with LD_PRELOAD=%s\n", argv[l + 3]);
                    return 1;
                }
            }
            times[l][c] = (now_us() - t0) / block;
        }
    }
    for (int l = 0; l < libs; l++)
        for (long c = 0; c < cycles; c++) diffs[l][c] = times[l][c] - times[0][c];
    for (int l = 0; l < libs; l++)
        printf("%s %.1f %.1f\n", argv[l + 3], median(times[l], cycles), median(diffs[l], cycles));
    return 0;
}
