/* The variadic members of the exec family. Stable Rust cannot define C-variadic functions, so
 * these collect their arguments exactly as glibc's own execl/execlp/execle do and call the
 * (hooked) execv, execvp and execve. They are reached through naked trampolines in exec_l.rs,
 * which are what the shim exports; these symbols stay hidden inside the library. */
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

#define HIDDEN __attribute__((visibility("hidden")))

static size_t count_args(va_list ap) {
    size_t argc = 1;
    while (va_arg(ap, const char *) != NULL) argc++;
    return argc;
}

HIDDEN int aether_journal_execl(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    size_t argc = count_args(ap);
    va_end(ap);
    char *argv[argc + 1];
    argv[0] = (char *)arg;
    va_start(ap, arg);
    for (size_t i = 1; i <= argc; i++) argv[i] = va_arg(ap, char *);
    va_end(ap);
    return execv(path, argv);
}

HIDDEN int aether_journal_execlp(const char *file, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    size_t argc = count_args(ap);
    va_end(ap);
    char *argv[argc + 1];
    argv[0] = (char *)arg;
    va_start(ap, arg);
    for (size_t i = 1; i <= argc; i++) argv[i] = va_arg(ap, char *);
    va_end(ap);
    return execvp(file, argv);
}

HIDDEN int aether_journal_execle(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    size_t argc = count_args(ap);
    va_end(ap);
    char *argv[argc + 1];
    argv[0] = (char *)arg;
    va_start(ap, arg);
    for (size_t i = 1; i <= argc; i++) argv[i] = va_arg(ap, char *);
    char **envp = va_arg(ap, char **);
    va_end(ap);
    return execve(path, argv, envp);
}
