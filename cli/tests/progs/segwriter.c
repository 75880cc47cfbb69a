/* Journals enough records to move a process onto journal segments, in the ways that can go
 * wrong with a shared mapping: several threads at once (segments fill and roll over), a fork
 * with and without the fork handlers (the child must never copy into its parent's segment),
 * a vfork child, and a SIGKILL while a segment is mapped.
 *
 *   segwriter threads T N | fork N | rawfork N | vfork N | kill N | maps N
 *
 * `maps` prints how many journal segments the process still has mapped at the end.
 * Every mode creates files named after who made them (t<thread>_<i>, p_<i>, c_<i>, v_0). */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int n_files;

static void make(const char *prefix, int i) {
    char name[64];
    snprintf(name, sizeof name, "%s_%d", prefix, i);
    int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, name, strlen(name)) < 0) {
        perror(name);
        exit(1);
    }
    close(fd);
}

static void batch(const char *prefix) {
    for (int i = 0; i < n_files; i++) make(prefix, i);
}

static void *worker(void *arg) {
    char prefix[16];
    snprintf(prefix, sizeof prefix, "t%ld", (long)arg);
    batch(prefix);
    return NULL;
}

static int wait_ok(pid_t pid) {
    int st;
    return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    const char *mode = argv[1];
    if (strcmp(mode, "threads") == 0 && argc == 4) {
        long t = atol(argv[2]);
        n_files = atoi(argv[3]);
        pthread_t th[64];
        if (t < 1 || t > 64) return 2;
        for (long i = 0; i < t; i++) pthread_create(&th[i], NULL, worker, (void *)i);
        for (long i = 0; i < t; i++) pthread_join(th[i], NULL);
        return 0;
    }
    n_files = atoi(argv[2]);
    batch("p0");
    if (strcmp(mode, "kill") == 0) {
        raise(SIGKILL);
        return 3;
    }
    if (strcmp(mode, "maps") == 0) {
        FILE *f = fopen("/proc/self/maps", "r");
        char line[4096];
        int mapped = 0;
        while (f && fgets(line, sizeof line, f))
            if (strstr(line, "/segments/")) mapped++;
        if (f) fclose(f);
        printf("%d\n", mapped);
        return 0;
    }
    pid_t pid;
    if (strcmp(mode, "fork") == 0) {
        pid = fork();
    } else if (strcmp(mode, "rawfork") == 0) {
        pid = (pid_t)syscall(SYS_fork); /* no fork handlers run in the child */
    } else if (strcmp(mode, "vfork") == 0) {
        pid = vfork();
        if (pid == 0) {
            /* Not portable, but what real programs do between vfork and exec. */
            int fd = open("v_0", O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) close(fd);
            _exit(fd >= 0 ? 0 : 1);
        }
        if (pid < 0 || !wait_ok(pid)) return 1;
        batch("p");
        return 0;
    } else {
        return 2;
    }
    if (pid < 0) return 1;
    if (pid == 0) {
        batch("c");
        _exit(0);
    }
    /* The child has finished before the parent writes again: a child copying into its
     * parent's segment would have put its records exactly where the parent's now go. */
    if (!wait_ok(pid)) return 1;
    batch("p");
    return 0;
}
