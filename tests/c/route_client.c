/* rtprof_route from the C reader library: route_client SOCKET PID FUNCTION
 * NAME prints rtprofd's answer; exit 0 done, 1 refused, 2 error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>

#include "rtprof_present.h"

int main(int argc, char **argv) {
    if (argc != 5) return 2;
    char answer[512];
    int rc = rtprof_route(argv[1], (uint32_t)strtoul(argv[2], 0, 10), argv[3], argv[4], answer,
                          sizeof answer);
    if (rc < 0) {
        fprintf(stderr, "route: %s\n", strerror(errno));
        return 2;
    }
    printf("%s\n", answer);
    return rc;
}
