/* The least a preload library can do to journal every exec before the program runs, for bench
 * EXEC's paired rows: what of the per-exec target (the do-nothing library's cost plus 20 us) is
 * left for everything else the shim does. Not a journal anyone could undo from.
 *
 * - posix_spawn: the parent stats the program, spawns, then takes an id from a shared counter
 *   page and copies one record (time, pids, program, argv[0], working directory) into a shared
 *   mapping of the session's `segment` file, at an offset taken from the same page, as the
 *   shim copies its records into its segments: no system call (write(2) to `journal` once the
 *   segment is full). The child runs none of this library's code (glibc's child calls execve
 *   itself).
 * - fork + execve: the forked child's execve does the same before the exec, but writes its
 *   record with write(2), as the shim's forked child does: fork copies no page table entry of
 *   a shared file mapping, so a copy into the segment would fault its page in again, and an
 *   ext4 write fault dirties the file's times. The parent opens its store (the journal, the
 *   counters, the segment) before it forks (pthread_atfork), as the shim does, so the child
 *   inherits it.
 * - vfork + exec (Python's subprocess, dash): the child's execve (or execv, Python's with the
 *   caller's environment) does the same. A parent that only starts commands this way runs none
 *   of the hooks above itself, nor a fork handler: it opens the journal at its first wait, as
 *   the shim opens its store, so that every child after the first inherits it (the first runs
 *   unjournaled). A child that closed the journal (Python's close_fds) still has the mapping;
 *   should it need the file, it opens it again for its record.
 *
 * Every call in the hooks is a raw system call and every byte is formatted by hand on the
 * stack: a forked child pays a page fault for each page of code or data it touches first, and
 * a libc function it had not called yet is one more. The session directory is
 * LEAST_JOURNAL_DIR (no journaling without it); `journal`, `counters` and `segment` are made
 * there.
 *
 * What it cannot do: anything the shim does besides writing the record: check the program,
 * resolve names, keep the environment, journal a change, or order its records. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int journal = -1;
static char journal_path[4096];
/* The segment's mapping (volatile: copied into byte by byte, never by a libc call a forked
 * child would fault in), its offset counter the counters page's third word. */
#define SEGMENT_SIZE (64L << 20)
static volatile char *segment;
/* Set in a forked child (not a vfork child, which runs in its parent's memory). */
static int forked;
static volatile unsigned long *counters;
static int (*real_posix_spawn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                               const posix_spawnattr_t *, char *const[], char *const[]);

/* A system call without libc's wrapper (whose code a forked child would fault in); elsewhere
 * than on x86-64, through libc's `syscall`. Returns the kernel's value (minus an errno). */
static long raw(long nr, long a, long b, long c, long d) {
#if defined(__x86_64__)
    long r;
    register long r10 __asm__("r10") = d;
    __asm__ volatile("syscall" : "=a"(r) : "0"(nr), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
    return r;
#else
    long r = syscall(nr, a, b, c, d);
    return r < 0 ? -errno : r;
#endif
}

/* Copies `s` to `o`: at most NAME_MAX_COPY bytes of it (a longer name is cut, so that the line
 * below always holds a record). */
#define NAME_MAX_COPY 4096
static char *put(char *o, const char *s) {
    for (int n = 0; *s && n < NAME_MAX_COPY; n++) *o++ = *s++;
    return o;
}

static char *num(char *o, unsigned long v) {
    char t[24];
    int n = 0;
    do t[n++] = '0' + v % 10; while (v /= 10);
    while (n) *o++ = t[--n];
    return o;
}

/* Opens the session's journal and maps its counters, once per process (in the parent). */
static void open_store(void) {
    const char *dir = getenv("LEAST_JOURNAL_DIR");
    if (journal >= 0 || !dir) return;
    char p[4096];
    snprintf(p, sizeof p, "%s/counters", dir);
    int c = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (c < 0 || ftruncate(c, 4096) != 0) return;
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, c, 0);
    close(c);
    if (m == MAP_FAILED) return;
    counters = m;
    snprintf(journal_path, sizeof journal_path, "%s/journal", dir);
    journal = open(journal_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    snprintf(p, sizeof p, "%s/segment", dir);
    int s = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (s < 0) return;
    /* Blocks allocated up front, as the shim's segments are: a copy never meets a full disk. */
    if (fallocate(s, 0, 0, SEGMENT_SIZE) == 0) {
        void *g = mmap(NULL, SEGMENT_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, s, 0);
        if (g != MAP_FAILED) segment = g;
    }
    close(s);
}

static void in_forked_child(void) { forked = 1; }

__attribute__((constructor)) static void start(void) { pthread_atfork(open_store, NULL, in_forked_child); }

/* Appends the exec record of `path` (child: its pid, or 0 for the caller's own exec). */
static void journal_exec(const char *call, const char *path, char *const argv[], long child) {
    if (journal < 0) return;
    unsigned long seq = __atomic_add_fetch(&counters[1], 1, __ATOMIC_SEQ_CST);
    struct timespec t;
    raw(SYS_clock_gettime, CLOCK_REALTIME, (long)&t, 0, 0);
    char cwd[4096];
    if (raw(SYS_getcwd, (long)cwd, sizeof cwd, 0, 0) < 0) cwd[0] = 0;
    /* Three names (program, argv[0], working directory) of at most NAME_MAX_COPY bytes each,
     * the literals and five numbers. */
    char line[3 * NAME_MAX_COPY + 1024], *o = line;
    o = put(o, "0000000000000000 {\"v\":1,\"seq\":");
    o = num(o, seq);
    o = put(o, ",\"time\":\"");
    o = num(o, t.tv_sec);
    o = put(o, ".");
    o = num(o, t.tv_nsec);
    o = put(o, "\",\"pid\":");
    o = num(o, raw(SYS_getpid, 0, 0, 0, 0));
    o = put(o, ",\"ppid\":");
    o = num(o, raw(SYS_getppid, 0, 0, 0, 0));
    o = put(o, ",\"call\":\"");
    o = put(o, call);
    o = put(o, "\",\"op\":{\"kind\":\"exec\",\"program\":\"");
    o = put(o, path);
    o = put(o, "\",\"argv\":[\"");
    o = put(o, argv[0] ? argv[0] : "");
    o = put(o, "\"],\"cwd\":\"");
    o = put(o, cwd);
    o = put(o, "\",\"child\":");
    o = num(o, child);
    o = put(o, "}}\n");
    long len = o - line;
    if (segment && !forked) {
        unsigned long at = __atomic_fetch_add(&counters[2], len, __ATOMIC_SEQ_CST);
        if (at + len <= SEGMENT_SIZE) {
            for (long i = 0; i < len; i++) segment[at + i] = line[i];
            return;
        }
    }
    if (raw(SYS_write, journal, (long)line, len, 0) == -EBADF) {
        long fd = raw(SYS_openat, AT_FDCWD, (long)journal_path, O_WRONLY | O_APPEND | O_CLOEXEC, 0);
        if (fd >= 0) raw(SYS_write, fd, (long)line, len, 0);
    }
}

int execve(const char *path, char *const argv[], char *const envp[]) {
    char st[256];
    raw(SYS_newfstatat, AT_FDCWD, (long)path, (long)st, 0);
    journal_exec("execve", path, argv, 0);
    long r = raw(SYS_execve, (long)path, (long)argv, (long)envp, 0);
    errno = (int)-r;
    return -1;
}

int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *actions,
                const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    if (!real_posix_spawn) real_posix_spawn = dlsym(RTLD_NEXT, "posix_spawn");
    open_store();
    char st[256];
    raw(SYS_newfstatat, AT_FDCWD, (long)path, (long)st, 0);
    int r = real_posix_spawn(pid, path, actions, attr, argv, envp);
    if (r == 0) journal_exec("posix_spawn", path, argv, *pid);
    return r;
}

int execv(const char *path, char *const argv[]) {
    extern char **environ;
    return execve(path, argv, environ);
}

pid_t wait3(int *status, int options, struct rusage *usage) {
    static pid_t (*real)(int *, int, struct rusage *);
    if (!real) real = dlsym(RTLD_NEXT, "wait3");
    open_store();
    return real(status, options, usage);
}

pid_t waitpid(pid_t pid, int *status, int options) {
    static pid_t (*real)(pid_t, int *, int);
    if (!real) real = dlsym(RTLD_NEXT, "waitpid");
    open_store();
    return real(pid, status, options);
}

pid_t wait4(pid_t pid, int *status, int options, struct rusage *usage) {
    static pid_t (*real)(pid_t, int *, int, struct rusage *);
    if (!real) real = dlsym(RTLD_NEXT, "wait4");
    open_store();
    return real(pid, status, options, usage);
}
