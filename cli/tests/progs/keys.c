/* The number a program's first thread-specific key gets (pthread_key_create) after its main
 * thread changed a file: prints "key K". Without the shim a program that made no key before
 * gets 0. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
    pthread_key_t key;
    int fd = open("from-main", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "x", 1) != 1 || close(fd) != 0) return 1;
    if (pthread_key_create(&key, NULL)) return 1;
    printf("key %u\n", (unsigned)key);
    return 0;
}
