#define _GNU_SOURCE
/* The mkstemp family and mkdtemp, each way they can be asked, with what they return, the
 * mode and flags of what they make, and how they fail on a bad template. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void show(const char *what, int fd, const char *name) {
    struct stat st;
    if (fd < 0) {
        printf("%s: %s\n", what, strerror(errno));
        return;
    }
    stat(name, &st);
    int cloexec = fcntl(fd, F_GETFD) & FD_CLOEXEC;
    int append = fcntl(fd, F_GETFL) & O_APPEND;
    int rw = (fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDWR;
    printf("%s: mode %o rw %d cloexec %d append %d len %zu\n", what, st.st_mode & 0777, rw, !!cloexec, !!append,
           strlen(name));
}

int main(void) {
    char a[] = "tmp-a-XXXXXX";
    show("mkstemp", mkstemp(a), a);
    char b[] = "tmp-b-XXXXXX";
    show("mkostemp", mkostemp(b, O_CLOEXEC | O_APPEND), b);
    char c[] = "tmp-c-XXXXXX.txt";
    show("mkstemps", mkstemps(c, 4), c);
    printf("mkstemps keeps its suffix: %d\n", strcmp(c + strlen(c) - 4, ".txt") == 0);
    char d[] = "tmp-d-XXXXXX.c";
    show("mkostemps", mkostemps(d, 2, O_CLOEXEC), d);
    char e[] = "tmp-e-XXXXXX";
    char *r = mkdtemp(e);
    struct stat st;
    if (r == e && stat(e, &st) == 0)
        printf("mkdtemp: the template itself, mode %o, dir %d\n", st.st_mode & 0777, S_ISDIR(st.st_mode));
    char bad[] = "tmp-bad-XXXXX";
    show("mkstemp with five Xs", mkstemp(bad), bad);
    printf("left as it was: %s\n", bad);
    char shortsuffix[] = "XXXXXX.c";
    show("mkstemps with a suffix longer than the template", mkstemps(shortsuffix, 4), shortsuffix);
    char *nul = mkdtemp(bad);
    printf("mkdtemp with five Xs: %s %s\n", nul ? "made" : "null", strerror(errno));
    return 0;
}
