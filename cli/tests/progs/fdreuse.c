/* Creates a file, lets its descriptor number go (one way per MODE), gets the same number back
 * on a file that existed before, and changes that file's mode and times through it. The shim
 * remembers descriptors that came from a creating open (their changes need no record): every
 * way of letting a number go must make it forget, or the old file's changes go unjournaled. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    const char *m = argc > 1 ? argv[1] : "close";
    int fd = open("created", O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) { perror("open created"); return 2; }
    int got = -1;
    if (!strcmp(m, "dup2") || !strcmp(m, "dup3")) {
        int e = open("existing", O_RDONLY);
        got = !strcmp(m, "dup2") ? dup2(e, fd) : dup3(e, fd, 0);
        close(e);
    } else if (!strcmp(m, "freopen")) {
        FILE *f = freopen("existing", "r", fdopen(fd, "w"));
        got = f ? fileno(f) : -1;
    } else {
        if (!strcmp(m, "close")) close(fd);
        else if (!strcmp(m, "fclose")) fclose(fdopen(fd, "w"));
        else if (!strcmp(m, "close_range")) close_range(fd, fd, 0);
        else if (!strcmp(m, "closefrom")) closefrom(fd);
        else if (!strcmp(m, "syscall")) syscall(SYS_close, fd);
        else { fprintf(stderr, "unknown mode %s\n", m); return 2; }
        got = open("existing", O_RDONLY);
    }
    if (got != fd) { fprintf(stderr, "%s: number %d not reused (got %d)\n", m, fd, got); return 3; }
    struct timespec t[2] = { { 1000000000, 0 }, { 1000000000, 0 } };
    if (fchmod(got, 0600) || futimens(got, t)) { perror("fchmod/futimens"); return 4; }
    printf("ok\n");
    return 0;
}
