/* The shim's per-thread state (its layout is src/thread.rs's `Thread`): one block of
 * initial-exec thread-local storage, which code reaches from the thread pointer, as libc
 * reaches its own errno, rather than through the dynamic loader's __tls_get_addr (what Rust's
 * thread_local! in a shared library calls). Stable Rust cannot choose the model; C can. */
#define HIDDEN __attribute__((visibility("hidden")))

/* Must be at least size_of::<Thread>() (checked in src/thread.rs). */
#define AETHER_JOURNAL_THREAD_BYTES 128

static __thread unsigned char block[AETHER_JOURNAL_THREAD_BYTES]
    __attribute__((tls_model("initial-exec"), aligned(16)));

HIDDEN unsigned char *aether_journal_thread(void) { return block; }
