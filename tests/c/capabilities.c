/* A root program that gives capabilities up while it runs:
 *   capabilities capset|syscall|bounding|libcap|capng|fsuid
 * then prints how many of its tasks still hold a capability (effective,
 * permitted or bounding) or a file system user id its main thread gave
 * up, and how many tasks it has. */
#define _GNU_SOURCE
#include <cap-ng.h>
#include <dirent.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/capability.h>
#include <sys/fsuid.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

struct creds { unsigned long long eff, prm, bnd; long fsuid; };

static int read_task(const char *tid, struct creds *c) {
    char p[128], line[256];
    snprintf(p, sizeof p, "/proc/self/task/%s/status", tid);
    FILE *f = fopen(p, "r");
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        sscanf(line, "CapEff: %llx", &c->eff);
        sscanf(line, "CapPrm: %llx", &c->prm);
        sscanf(line, "CapBnd: %llx", &c->bnd);
        long r, e, s;
        if (sscanf(line, "Uid: %ld %ld %ld %ld", &r, &e, &s, &c->fsuid) == 4) {}
    }
    fclose(f);
    return 0;
}

static void drop(const char *how) {
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2] = {{0}};
    if (!strcmp(how, "capset")) {
        if (capset(&h, d)) perror("capset");
    } else if (!strcmp(how, "syscall")) {
        if (syscall(SYS_capset, &h, d)) perror("capset");
    } else if (!strcmp(how, "bounding")) {
        for (int c = 0; c <= CAP_LAST_CAP; c++) prctl(PR_CAPBSET_DROP, c, 0, 0, 0);
    } else if (!strcmp(how, "libcap")) {
        cap_t none = cap_init();
        if (cap_set_proc(none)) perror("cap_set_proc");
        cap_free(none);
    } else if (!strcmp(how, "capng")) {
        capng_clear(CAPNG_SELECT_BOTH);
        if (capng_apply(CAPNG_SELECT_BOTH)) perror("capng_apply");
    } else if (!strcmp(how, "fsuid")) {
        setfsuid(65534);
    }
}

int main(int argc, char **argv) {
    volatile double x = 0;
    for (int i = 0; i < 10000000; i++) x += i; /* the agent's threads run by now */
    drop(argc > 1 ? argv[1] : "capset");
    for (int i = 0; i < 10000000; i++) x += i;
    char self[32];
    snprintf(self, sizeof self, "%ld", (long)syscall(SYS_gettid));
    struct creds main_ = {0};
    read_task(self, &main_);
    int tasks = 0, keeping = 0;
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        struct creds c = {0};
        if (read_task(e->d_name, &c)) continue;
        tasks++;
        if ((c.eff & ~main_.eff) || (c.prm & ~main_.prm) || (c.bnd & ~main_.bnd) || c.fsuid != main_.fsuid)
            keeping++;
    }
    closedir(d);
    printf("main thread: eff %llx prm %llx bnd %llx fsuid %ld\n", main_.eff, main_.prm, main_.bnd, main_.fsuid);
    printf("tasks keeping what the main thread gave up: %d\n", keeping);
    fprintf(stderr, "tasks: %d\n", tasks);
    return 0;
}
