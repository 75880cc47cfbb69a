/* A child made each way libc forks changes a file named after its own pid (`made-by-PID`), so
 * that a test can check the pid its record carries. argv[1]: fork, __fork, _Fork, daemon,
 * forkpty, or _Fork-in-handler (`_Fork`, which is async-signal-safe, called by a signal
 * handler while the main loop keeps changing a file through the shim). The parent changes a
 * file first (`made-by-PID` too), so it has its store and its ids when it forks. Exit status 0
 * when every step worked. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

extern pid_t __fork(void);

static void change(void) {
    char nm[64];
    snprintf(nm, sizeof nm, "made-by-%d", (int)getpid());
    int fd = open(nm, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, "x", 1) != 1) _exit(3);
    close(fd);
}

static volatile pid_t handler_child = -1;

static void fork_in_handler(int sig) {
    (void)sig;
    pid_t pid = _Fork();
    if (pid == 0) {
        change();
        _exit(0);
    }
    handler_child = pid;
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    const char *how = argv[1];
    change();
    if (!strcmp(how, "_Fork-in-handler")) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = fork_in_handler;
        sigaction(SIGALRM, &sa, NULL);
        struct itimerval it = {{0, 0}, {0, 2000}};
        setitimer(ITIMER_REAL, &it, NULL);
        for (long i = 0; handler_child < 0 && i < 10000000; i++) {
            int fd = open("main-loop", O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) close(fd);
        }
        if (handler_child <= 0) return 9;
        int st;
        if (waitpid(handler_child, &st, 0) != handler_child) return 7;
        return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 8;
    }
    if (!strcmp(how, "daemon")) {
        /* daemon() forks inside libc and exits in the parent: do it in a child of ours, and
         * wait for the daemon's word on a pipe. */
        int p[2];
        if (pipe(p) != 0) return 4;
        pid_t helper = fork();
        if (helper == 0) {
            close(p[0]);
            if (daemon(1, 1) != 0) _exit(4);
            change();
            if (write(p[1], "k", 1) != 1) _exit(5);
            _exit(0);
        }
        close(p[1]);
        char c;
        if (read(p[0], &c, 1) != 1) return 5;
        int st;
        waitpid(helper, &st, 0);
        return 0;
    }
    pid_t pid;
    int master;
    if (!strcmp(how, "fork")) pid = fork();
    else if (!strcmp(how, "__fork")) pid = __fork();
    else if (!strcmp(how, "_Fork")) pid = _Fork();
    else if (!strcmp(how, "forkpty")) pid = forkpty(&master, NULL, NULL, NULL);
    else return 2;
    if (pid < 0) return 6;
    if (pid == 0) {
        change();
        _exit(0);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) return 7;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 8;
}
