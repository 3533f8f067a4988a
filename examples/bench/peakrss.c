/* Runs a command and writes its peak resident memory (KiB) to a file. A
 * launcher of its own, because a child forked from a large process (the
 * harness) starts with that process's peak. The command's own environment
 * settings come as NAME=VALUE arguments before "--", so that a preloaded
 * profiler sees the command only, not this launcher.
 *
 * usage: peakrss out-file [NAME=VALUE...] -- command [args] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int cmd = 2;
    while (cmd < argc && strcmp(argv[cmd], "--") != 0) cmd++;
    if (cmd + 1 >= argc) {
        fprintf(stderr, "usage: %s out-file [NAME=VALUE...] -- command [args]\n", argv[0]);
        return 127;
    }
    pid_t pid = fork();
    if (pid == 0) {
        for (int i = 2; i < cmd; i++) putenv(argv[i]);
        execvp(argv[cmd + 1], argv + cmd + 1);
        _exit(127);
    }
    int status;
    struct rusage ru;
    if (pid < 0 || wait4(pid, &status, 0, &ru) < 0) return 127;
    FILE *f = fopen(argv[1], "w");
    if (f) {
        fprintf(f, "%ld\n", ru.ru_maxrss);
        fclose(f);
    }
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}
