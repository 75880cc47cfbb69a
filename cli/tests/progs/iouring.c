/* Sets up an io_uring (through which files can change without any watched call), with an
 * inline system call ("raw") or through libc's syscall() ("libc"). Prints the errno on
 * failure. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    unsigned char params[120];
    memset(params, 0, sizeof params);
    long r;
    if (argc > 1 && strcmp(argv[1], "libc") == 0) {
        r = syscall(SYS_io_uring_setup, 4, params);
        if (r < 0) r = -errno;
    } else {
        register long a1 __asm__("rdi") = 4;
        register long a2 __asm__("rsi") = (long)params;
        __asm__ volatile("syscall" : "=a"(r) : "a"((long)SYS_io_uring_setup), "r"(a1), "r"(a2) : "rcx", "r11", "memory");
    }
    if (r < 0) {
        printf("%s\n", strerror((int)-r));
        return 1;
    }
    printf("ring\n");
    return 0;
}
