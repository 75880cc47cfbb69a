/* Creates 100 files with inline system calls whose registers are all the same: one name
 * buffer, rewritten between calls, as Bun's runtime does. Every call is a new one. */
#include <fcntl.h>
#include <stdio.h>
#include <sys/syscall.h>

static char name[32];

static long openat_raw(const char *path) {
    long ret;
    register long r10 __asm__("r10") = 0644;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"((long)SYS_openat), "D"((long)AT_FDCWD), "S"(path), "d"((long)(O_WRONLY | O_CREAT | O_EXCL)),
                       "r"(r10)
                     : "rcx", "r11", "memory");
    return ret;
}

static void close_raw(long fd) {
    long ret;
    __asm__ volatile("syscall" : "=a"(ret) : "a"((long)SYS_close), "D"(fd) : "rcx", "r11", "memory");
}

int main(void) {
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof name, "made-%03d", i);
        long fd = openat_raw(name);
        if (fd < 0) return 1;
        close_raw(fd);
    }
    return 0;
}
