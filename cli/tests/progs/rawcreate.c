/* Creates N files under d/ with inline `syscall` instructions, never through libc: each
 * creation reaches the supervisor, which the test counts the system calls of. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>

static long raw(long nr, long a, long b, long c, long d) {
    long ret;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return ret;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 100;
    char name[64];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "d/f%04d", i);
        long fd = raw(SYS_openat, AT_FDCWD, (long)name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) return 1;
        raw(SYS_write, fd, (long)"x\n", 2, 0);
        raw(SYS_close, fd, 0, 0, 0);
    }
    return 0;
}
