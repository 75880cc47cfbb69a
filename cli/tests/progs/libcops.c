/* File changes made only through libc's exported functions, the shim's hooks: the shim
 * journals them, and the supervisor must not be asked about any of them (the test counts its
 * notifications). With "pass" as argv[1], also the libc functions whose own system calls the
 * shim cannot mark (fopen, mkstemp, remove, utimes given times), which reach the supervisor
 * holding a pass. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>
#include <utime.h>

int main(int argc, char **argv) {
    int fd = open("created", O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0 || write(fd, "x\n", 2) != 2) return 1;
    fchmod(fd, 0600);
    close(fd);
    fd = open("overwritten", O_WRONLY | O_TRUNC);
    if (fd < 0 || write(fd, "y\n", 2) != 2) return 2;
    close(fd);
    if (unlink("removed") || rename("from", "to") || mkdir("dir", 0755) || chmod("mode", 0600)) return 3;
    if (symlink("created", "link") || link("to", "hardlink") || truncate("truncated", 1)) return 4;
    if (rmdir("emptydir") || chown("owned", getuid(), getgid())) return 5;
    struct timespec ts[2] = {{1, 0}, {2, 0}};
    if (utimensat(AT_FDCWD, "timed", ts, 0)) return 6;
    /* Asked for "now", the older forms are that same utimensat: the shim makes it, marked. */
    if (utime("timed", NULL) || utimes("timed", NULL) || lutimes("link", NULL)) return 11;
    if (futimesat(AT_FDCWD, "timed", NULL)) return 12;
    fd = open("overwritten", O_WRONLY);
    if (fd < 0 || futimes(fd, NULL)) return 13;
    close(fd);
    if (argc > 1 && strcmp(argv[1], "pass") == 0) {
        FILE *f = fopen("fopened", "w");
        if (!f || fputs("z\n", f) < 0 || fclose(f)) return 7;
        char tmpl[] = "tmpXXXXXX";
        int t = mkstemp(tmpl);
        if (t < 0) return 8;
        close(t);
        if (unlink(tmpl) || remove("removed-too")) return 9;
        struct timeval tv[2] = {{3, 0}, {4, 0}};
        if (utimes("timed", tv)) return 10;
    }
    return 0;
}
