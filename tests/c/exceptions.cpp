// C++ exceptions thrown through several instrumented frames, caught where
// expected; destructors of the unwound frames run.
#include <cstdio>
#include <stdexcept>
#include <string>

#define NOINLINE __attribute__((noinline, noclone))
static int destroyed;
struct Guard { ~Guard() { destroyed++; } };

extern "C" {
NOINLINE int level3(int x) {
    Guard g;
    if (x % 3 == 0) throw std::runtime_error("boom " + std::to_string(x));
    return x;
}
NOINLINE int level2(int x) { Guard g; return level3(x) + 1; }
NOINLINE int level1(int x) { Guard g; return level2(x) + 1; }
NOINLINE int catcher(int x) {
    try {
        return level1(x);
    } catch (const std::runtime_error &e) {
        std::printf("caught %s\n", e.what());
        return -1;
    }
}
}

int main() {
    int sum = 0;
    for (int i = 0; i < 30; i++) sum += catcher(i);
    std::printf("sum %d destroyed %d\n", sum, destroyed);
    std::printf("EXPECT catcher 30\nEXPECT level1 30\nEXPECT level2 30\nEXPECT level3 30\n");
    return destroyed == 90 ? 0 : 1;
}
