/* W7: N read-only open+close pairs of one file (default 1,000,000). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: open_close FILE [N]\n");
        return 2;
    }
    long n = argc > 2 ? atol(argv[2]) : 1000000;
    for (long i = 0; i < n; i++) {
        int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            perror("open");
            return 1;
        }
        close(fd);
    }
    return 0;
}
