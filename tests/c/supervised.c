/* A seccomp supervisor (SECCOMP_RET_USER_NOTIF), as container runtimes
 * run them: every system call of PROG but a few is sent to this process,
 * which counts it, waits DELAY_MS (a slow supervisor) and lets it go on.
 *   supervised DELAY_MS PROG ARGS...
 * Prints PROG's output as it comes, then on stderr "notifications: N" and
 * PROG's exit status. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define PASS(n) \
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (n), 0, 1), \
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int delay_ms = atoi(argv[1]);
    int pipefd[2];
    if (pipe(pipefd)) return 2;
    pid_t child = fork();
    if (child == 0) {
        /* Calls that must not wait for the supervisor: handing it the
         * listener (write), and ending. */
        struct sock_filter f[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            PASS(__NR_write), PASS(__NR_exit), PASS(__NR_exit_group),
            PASS(__NR_rt_sigreturn),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
        };
        struct sock_fprog prog = {sizeof f / sizeof f[0], f};
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) _exit(3);
        int fd = syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER,
                         SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
        if (fd < 0) _exit(4);
        if (write(pipefd[1], &fd, sizeof fd) != sizeof fd) _exit(5);
        execvp(argv[2], argv + 2);
        _exit(6);
    }
    int remote;
    if (read(pipefd[0], &remote, sizeof remote) != sizeof remote) return 2;
    int pidfd = syscall(SYS_pidfd_open, child, 0);
    int fd = syscall(SYS_pidfd_getfd, pidfd, remote, 0);
    if (fd < 0) { perror("pidfd_getfd"); return 2; }
    struct seccomp_notif_sizes sizes;
    syscall(__NR_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &sizes);
    struct seccomp_notif *req = calloc(1, sizes.seccomp_notif);
    struct seccomp_notif_resp *resp = calloc(1, sizes.seccomp_notif_resp);
    long n = 0;
    int status = 0;
    for (;;) {
        if (waitpid(child, &status, WNOHANG) == child) break;
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0 || !(p.revents & POLLIN)) continue;
        memset(req, 0, sizes.seccomp_notif);
        if (ioctl(fd, SECCOMP_IOCTL_NOTIF_RECV, req)) continue;
        n++;
        if (delay_ms) usleep(delay_ms * 1000);
        memset(resp, 0, sizes.seccomp_notif_resp);
        resp->id = req->id;
        resp->flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
        ioctl(fd, SECCOMP_IOCTL_NOTIF_SEND, resp);
    }
    fprintf(stderr, "notifications: %ld\nstatus %d\n", n,
            WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    return 0;
}
