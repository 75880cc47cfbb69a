/* 8 processes x 4 threads mutating disjoint and overlapping files at once: writes, in-place
 * edits, truncations, appends, renames over, removals, directories. Seeded, deterministic per
 * thread; the interleaving is not. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int proc_id;

static void *work(void *arg) {
    long tid = (long)arg;
    unsigned seed = (unsigned)(proc_id * 131 + tid * 7 + 1);
    char path[128], other[128], buf[256];
    for (int i = 0; i < 300; i++) {
        int r = rand_r(&seed) % 9;
        int shared = rand_r(&seed) % 2;
        if (shared) snprintf(path, sizeof path, "shared/f%d", rand_r(&seed) % 12);
        else snprintf(path, sizeof path, "own/p%d-t%ld-%d", proc_id, tid, rand_r(&seed) % 8);
        snprintf(other, sizeof other, "%s.tmp%d-%ld", path, proc_id, tid);
        int n = snprintf(buf, sizeof buf, "p%d t%ld i%d\n", proc_id, tid, i);
        int fd;
        switch (r) {
        case 0: case 1:
            fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) { (void)!write(fd, buf, n); close(fd); }
            break;
        case 2:
            fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
            if (fd >= 0) { (void)!write(fd, buf, n); close(fd); }
            break;
        case 3:
            fd = open(path, O_RDWR);
            if (fd >= 0) { (void)!pwrite(fd, "EDIT", 4, 1); close(fd); }
            break;
        case 4:
            truncate(path, rand_r(&seed) % 5);
            break;
        case 5:
            fd = open(other, O_WRONLY | O_CREAT | O_EXCL, 0600);
            if (fd >= 0) { (void)!write(fd, buf, n); close(fd); rename(other, path); }
            break;
        case 6:
            unlink(path);
            break;
        case 7:
            chmod(path, 0600 + (rand_r(&seed) % 2) * 040);
            break;
        case 8:
            snprintf(other, sizeof other, "own/d%d-%ld", proc_id, tid);
            if (mkdir(other, 0755) != 0) rmdir(other);
            break;
        }
    }
    return NULL;
}

int main(void) {
    for (int p = 0; p < 8; p++) {
        if (fork() == 0) {
            proc_id = p;
            pthread_t t[4];
            for (long i = 0; i < 4; i++) pthread_create(&t[i], NULL, work, (void *)i);
            for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
            _exit(0);
        }
    }
    while (wait(NULL) > 0) {}
    puts("done");
    return 0;
}
