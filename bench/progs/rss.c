/* Resident memory of a hooked process: does the mutations a typical tool does (create, write,
 * rename over, unlink, mkdir, rmdir: so the shim has opened its store and journaled), then
 * prints its own VmRSS and VmHWM in KiB, "RSS HWM". */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static long field(const char *name) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    size_t n = strlen(name);
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, name, n) == 0) {
            sscanf(line + n, "%ld", &v);
        }
    }
    if (f) fclose(f);
    return v;
}

int main(int argc, char **argv) {
    if (argc < 2 || chdir(argv[1]) != 0) {
        fprintf(stderr, "usage: rss DIR\n");
        return 2;
    }
    for (int i = 0; i < 200; i++) {
        char a[64], b[64];
        snprintf(a, sizeof a, "f%d.tmp", i);
        snprintf(b, sizeof b, "f%d", i);
        int fd = open(a, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, "data\n", 5) != 5) return 1;
        close(fd);
        if (rename(a, b) != 0) return 1;
    }
    mkdir("d", 0755);
    rmdir("d");
    for (int i = 0; i < 200; i++) {
        char b[64];
        snprintf(b, sizeof b, "f%d", i);
        unlink(b);
    }
    printf("%ld %ld\n", field("VmRSS:"), field("VmHWM:"));
    return 0;
}
