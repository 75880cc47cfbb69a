/* Changes its working directory through libc (chdir, fchdir, and syscall(SYS_chdir)) between
 * creations made with inline `syscall` instructions, which only the supervisor sees: each
 * creation names `a/f` relative to a working directory the supervisor last looked at moments
 * before, so it must know of every change in between although none of them reaches it (the
 * shim makes them itself, marked). */
#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

static long raw(long nr, long a, long b, long c, long d) {
    long ret;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return ret;
}

/* Writes `what` to a/f, created or truncated, past libc. */
static int put(const char *what, long len) {
    long fd = raw(SYS_openat, AT_FDCWD, (long)"a/f", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return 1;
    raw(SYS_write, fd, (long)what, len, 0);
    raw(SYS_close, fd, 0, 0, 0);
    return 0;
}

int main(void) {
    int top = open(".", O_RDONLY | O_DIRECTORY);
    if (top < 0 || put("made at the top\n", 16)) return 1;
    if (chdir("x") || put("over x's\n", 9)) return 2;
    if (fchdir(top) || put("top again\n", 10)) return 3;
    if (syscall(SYS_chdir, "y") || put("over y's\n", 9)) return 4;
    return 0;
}
