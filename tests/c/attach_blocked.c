/* A single-threaded program that spends its life blocked in one system
 * call, as servers do, or busy in libc's code: rtprof attach must catch
 * it all the same, and leave the blocked call as it was (no EINTR: the
 * program installs no signal handler, so it never gets one on its own).
 * Every line read runs work(N) and prints its result; the output depends
 * only on the input.
 * Usage: attach_blocked read|epoll     (lines on stdin, until EOF)
 *        attach_blocked accept PATH    (a line per connection to the unix
 *                                       socket PATH, "quit" ends)
 *        attach_blocked busy N         (N rounds of strlen, then exits) */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

__attribute__((noinline)) unsigned long work(unsigned long n) {
    unsigned long x = n;
    for (unsigned long i = 0; i < n * 1000000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

static void fail(const char *what) {
    printf("%s: %s\n", what, strerror(errno));
    fflush(stdout);
    exit(3);
}

static void answer(const char *line, int fd) {
    char out[128];
    int n = snprintf(out, sizeof out, "%lu -> %lu\n", strtoul(line, NULL, 10),
                     work(strtoul(line, NULL, 10)));
    if (fd >= 0) {
        if (write(fd, out, n) != n)
            fail("write");
    }
    fputs(out, stdout);
    fflush(stdout);
}

/* Lines from fd 0; with `ep`, each read waits in epoll_wait first. */
static int lines(int ep) {
    char buf[4096];
    size_t have = 0;
    for (;;) {
        if (ep >= 0) {
            struct epoll_event ev;
            int n = epoll_wait(ep, &ev, 1, -1);
            if (n < 0)
                fail("epoll_wait");
            if (n != 1)
                continue;
        }
        ssize_t r = read(0, buf + have, sizeof buf - 1 - have);
        if (r < 0)
            fail("read");
        if (r == 0)
            break;
        have += (size_t)r;
        buf[have] = 0;
        char *nl;
        while ((nl = strchr(buf, '\n'))) {
            *nl = 0;
            answer(buf, -1);
            have -= (size_t)(nl + 1 - buf);
            memmove(buf, nl + 1, have + 1);
        }
    }
    puts("eof");
    return 0;
}

static int accepting(const char *path) {
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, path, sizeof a.sun_path - 1);
    unlink(path);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 8))
        fail("listen");
    puts("ready");
    fflush(stdout);
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0)
            fail("accept");
        char buf[256];
        size_t have = 0;
        ssize_t r;
        while (have < sizeof buf - 1 && (r = read(c, buf + have, sizeof buf - 1 - have)) > 0) {
            have += (size_t)r;
            if (memchr(buf, '\n', have))
                break;
        }
        if (r < 0)
            fail("read");
        buf[have] = 0;
        if (strncmp(buf, "quit", 4) == 0)
            break;
        answer(buf, c);
        close(c);
    }
    puts("quit");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    if (strcmp(argv[1], "read") == 0 || strcmp(argv[1], "epoll") == 0) {
        int ep = -1;
        if (argv[1][0] == 'e') {
            ep = epoll_create1(0);
            struct epoll_event ev = {.events = EPOLLIN};
            if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev))
                fail("epoll");
        }
        puts("ready");
        fflush(stdout);
        return lines(ep);
    }
    if (strcmp(argv[1], "accept") == 0 && argc > 2)
        return accepting(argv[2]);
    if (strcmp(argv[1], "busy") == 0 && argc > 2) {
        static char text[8192];
        memset(text, 'x', sizeof text - 1);
        unsigned long rounds = strtoul(argv[2], NULL, 10), total = 0;
        puts("ready");
        fflush(stdout);
        for (unsigned long i = 0; i < rounds; i++) {
            text[i % (sizeof text - 1)] = 0;
            total += strlen(text) + strlen(text + 1 + i % 4000);
            text[i % (sizeof text - 1)] = 'x';
            if (i % 100000 == 0)
                total += work(1) & 1;
        }
        printf("done %lu\n", total);
        return 0;
    }
    return 2;
}
