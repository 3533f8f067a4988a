/* Lists its open descriptors, in the parent and in a forked child: the
 * agent must not add any. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void list(const char *who) {
    DIR *d = opendir("/proc/self/fd");
    int self = dirfd(d), n = 0;
    struct dirent *e;
    printf("%s:", who);
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' && atoi(e->d_name) != self) printf(" %s", e->d_name), n++;
    printf(" (%d)\n", n);
    closedir(d);
    fflush(stdout);
}

int main(void) {
    list("parent");
    pid_t pid = fork();
    if (pid == 0) {
        list("child");
        _exit(0);
    }
    waitpid(pid, 0, 0);
    return 0;
}
