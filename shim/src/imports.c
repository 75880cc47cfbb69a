/* libc functions the shim calls rarely (most of them from Rust's standard library inside it),
 * looked up on first use instead of by the loader in every process that loads the shim.
 *
 * Each function the shim imports is a symbol the dynamic loader looks up at load time in every
 * process (the shim is linked with full RELRO, and Rust's standard library calls libc through
 * the GOT, so none of it is lazy): a walk of each loaded object's hash tables, most of it in
 * libc pages a small program never touched (measured: 51 imports cost a library of no code
 * 12.7 us a spawn of /bin/true). A process that changes nothing calls none of the functions
 * below. Each is defined here, hidden (never exported: the program's own calls never reach
 * it), so the link binds the shim's calls to it directly and the loader has nothing to look
 * up; on its first call it asks `dlsym(RTLD_NEXT)` for libc's definition, keeps it in an atomic
 * pointer (a race looks it up twice and stores the same value), and calls it with the same
 * arguments. errno is kept across the lookup, so the call's errno is libc's own.
 *
 * What stays imported, looked up at load: what every process's start-up, every hook's guard or
 * every hook given a path calls (memcpy, errno, the thread-local helpers, `environ`; strlen,
 * which the constructor no longer calls, see `c_len` in src/state/env.rs), the
 * allocator's malloc family (dlsym itself may allocate), `dlsym`, and what most processes of
 * the agent loop that journal or close a stream call (`getauxval` and `dladdr` when a store
 * opens, `fileno` in the fclose hook, `dirfd` in closedir's, `clock_gettime`): looked up on
 * first use, each cost a `dlsym` in about half of the loop's processes, more than a lookup at
 * load in all of them (LD_DEBUG=bindings of 2 turns, about 70 images: getauxval resolved in
 * 41 of them, dladdr in 27, fileno in 21).
 *
 * What this cannot do: make a missing function appear. Where libc has no such symbol (none of
 * these is newer than glibc 2.35; the shim is built and tested with 2.36), the call fails with
 * ENOSYS (`abort` then ends the process with a trap). */
#include <errno.h>
#include <stddef.h>
#include <sys/types.h>

/* From <dlfcn.h>, which also declares `dladdr` (defined below with a plainer prototype). */
extern void *dlsym(void *handle, const char *name);
#define RTLD_NEXT ((void *)-1l)

/* In the constructor's window of code (shim/startup.ld), which every process has faulted in
 * already: placed where the linker would put them (after all of `.text`), the few a
 * journaling process calls cost it a 64 KiB window of code of their own, a page fault in each
 * such process (perf's page-fault records of 3 turns of the agent loop: 69 more). */
#define HIDDEN __attribute__((visibility("hidden"), section(".text.startup.aether_journal.imports")))

static void *resolve(void **slot, const char *name) {
    void *p = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
    if (p) return p;
    int saved = errno;
    p = dlsym(RTLD_NEXT, name);
    errno = saved;
    __atomic_store_n(slot, p, __ATOMIC_RELEASE);
    return p;
}

/* NAME(PARAMS) returning RET, calling libc's NAME(ARGS); FAIL (with errno ENOSYS) if there is
 * none. Prototypes are written with plain pointer types: no libc header declares these names
 * here (-fno-builtin), so none can disagree. */
#define LAZY(ret, name, params, args, fail)                                        \
    HIDDEN ret name params {                                                       \
        static void *slot;                                                         \
        ret(*real) params = (ret(*) params)resolve(&slot, #name);                  \
        if (!real) {                                                               \
            errno = ENOSYS;                                                        \
            return fail;                                                           \
        }                                                                          \
        return real args;                                                          \
    }

struct stat;
struct pollfd;
struct iovec;

LAZY(int, __xpg_strerror_r, (int e, char *buf, size_t n), (e, buf, n), ENOSYS)
LAZY(int, dl_iterate_phdr, (int (*cb)(void *, size_t, void *), void *data), (cb, data), 0)
LAZY(void *, fdopen, (int fd, const char *mode), (fd, mode), NULL)
LAZY(int, fstat64, (int fd, struct stat *st), (fd, st), -1)
LAZY(char *, getcwd, (char *buf, size_t size), (buf, size), NULL)
LAZY(char *, getenv, (const char *name), (name), NULL)
LAZY(long, lseek64, (int fd, long off, int whence), (fd, off, whence), -1)
LAZY(void *, mmap64, (void *addr, size_t len, int prot, int flags, int fd, long off),
     (addr, len, prot, flags, fd, off), (void *)-1)
LAZY(int, munmap, (void *addr, size_t len), (addr, len), -1)
LAZY(void *, opendir, (const char *name), (name), NULL)
LAZY(int, poll, (struct pollfd *fds, unsigned long n, int timeout), (fds, n, timeout), -1)
LAZY(void *, readdir64, (void *dir), (dir), NULL)
LAZY(ssize_t, readlink, (const char *path, char *buf, size_t size), (path, buf, size), -1)
LAZY(char *, realpath, (const char *path, char *resolved), (path, resolved), NULL)
LAZY(int, setenv, (const char *name, const char *value, int overwrite), (name, value, overwrite), -1)
LAZY(int, stat64, (const char *path, struct stat *st), (path, st), -1)
LAZY(ssize_t, read, (int fd, void *buf, size_t n), (fd, buf, n), -1)
LAZY(ssize_t, write, (int fd, const void *buf, size_t n), (fd, buf, n), -1)
LAZY(ssize_t, writev, (int fd, const struct iovec *iov, int n), (fd, iov, n), -1)
LAZY(int, pthread_key_create, (unsigned *key, void (*dtor)(void *)), (key, dtor), EAGAIN)
LAZY(int, pthread_key_delete, (unsigned key), (key), EINVAL)
LAZY(int, pthread_setspecific, (unsigned key, const void *value), (key, value), ENOMEM)
LAZY(int, _dl_find_object, (void *pc, void *result), (pc, result), -1)

/* What the standard library's `weak!` calls reach (`statx` for `std::fs::metadata`, `gettid`
 * for the panic message's thread) and what the statically linked unwinder calls while it
 * unwinds (its lock, its once-only set-up, and `__pthread_key_create`, whose address alone
 * tells it threads exist): weak imports, looked up at load all the same, for code that a
 * process that changes nothing never runs. Defined here, they are never null, so the callers
 * take the calls' own fallbacks (std's on ENOSYS) rather than their "no such function" ones. */
LAZY(int, statx, (int dirfd, const char *path, int flags, unsigned mask, void *buf), (dirfd, path, flags, mask, buf),
     -1)
LAZY(int, gettid, (void), (), -1)
LAZY(int, __pthread_key_create, (unsigned *key, void (*dtor)(void *)), (key, dtor), EAGAIN)
LAZY(int, pthread_once, (int *once, void (*init)(void)), (once, init), EINVAL)
LAZY(int, pthread_mutex_lock, (void *mutex), (mutex), EINVAL)
LAZY(int, pthread_mutex_unlock, (void *mutex), (mutex), EINVAL)

HIDDEN _Noreturn void abort(void) {
    static void *slot;
    void (*real)(void) = (void (*)(void))resolve(&slot, "abort");
    if (real) real();
    __builtin_trap();
}

/* The statically linked unwinder (libgcc_eh.a, compiled with a PLT) calls `malloc`, `free`
 * and `strlen` through PLT slots, which the loader binds at load (full RELRO) in a lookup of
 * their own, besides the lookup that binds the GOT entry the rest of the shim calls them
 * through: three lookups in every process for functions already looked up. Linked with
 * `--wrap` (shim/build.rs), every call of the three in the shim reaches these instead, and
 * they call libc's through that one GOT entry (this file is compiled with -fno-plt). */
extern void *__real_malloc(size_t n);
extern void __real_free(void *p);
extern size_t __real_strlen(const char *s);
HIDDEN void *__wrap_malloc(size_t n) { return __real_malloc(n); }
HIDDEN void __wrap_free(void *p) { __real_free(p); }
HIDDEN size_t __wrap_strlen(const char *s) { return __real_strlen(s); }
