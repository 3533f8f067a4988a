/* The route request of rtprof's C reader library (see rtprof_present.h):
 * asks rtprofd to send a followed process's calls of one function to an
 * implementation the program offered, and returns rtprofd's answer, given
 * once the process's agent has done it or said why not. The bytes are
 * those of `rtprof_abi::protocol::route_request`. */
#include "rtprof_present.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define GREETING "RTPROFR1"
#define MAX_NAMES 240 /* protocol::MAX_PATTERN */

int rtprof_route(const char *socket_path, uint32_t pid, const char *function,
                 const char *implementation, char *answer, size_t size) {
    if (!socket_path) {
        socket_path = getenv("RTPROF_DAEMON_SOCKET");
        if (!socket_path || !*socket_path) socket_path = RTPROF_DEFAULT_SOCKET;
    }
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (!function || !implementation) {
        errno = EINVAL;
        return -1;
    }
    size_t f = strlen(function), i = strlen(implementation);
    if (!f || !i || f + 1 + i > MAX_NAMES || strlen(socket_path) >= sizeof addr.sun_path) {
        errno = EINVAL;
        return -1;
    }
    char msg[8 + 4 + MAX_NAMES];
    memcpy(msg, GREETING, 8);
    for (int k = 0; k < 4; k++) msg[8 + k] = (char)(pid >> (8 * k));
    memcpy(msg + 12, function, f + 1);
    memcpy(msg + 13 + f, implementation, i);
    size_t len = 13 + f + i;
    strcpy(addr.sun_path, socket_path);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    struct timeval five = {.tv_sec = 5};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &five, sizeof five);
    setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &five, sizeof five);
    ssize_t sent = -1;
    if (connect(s, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        (sent = send(s, msg, len, MSG_NOSIGNAL)) != (ssize_t)len) {
        int e = sent >= 0 ? EIO : errno;
        close(s);
        errno = e;
        return -1;
    }
    char line[4096];
    size_t got = 0;
    for (ssize_t n; got < sizeof line - 1 && (n = recv(s, line + got, sizeof line - 1 - got, 0)) != 0;) {
        if (n < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            close(s);
            errno = e;
            return -1;
        }
        got += (size_t)n;
    }
    close(s);
    line[got] = 0;
    line[strcspn(line, "\n")] = 0;
    int ok = !strncmp(line, "ok: ", 4);
    const char *text = ok ? line + 4 : !strncmp(line, "error: ", 7) ? line + 7 : line;
    if (!*line) {
        errno = ECONNRESET;
        return -1;
    }
    if (size) {
        strncpy(answer, text, size - 1);
        answer[size - 1] = 0;
    }
    return ok ? 0 : 1;
}
