/* C++ functions and a member function: a report names them as people
 * write them (leaf(int), geo::Point::norm(int) const), JSON keeps the
 * symbols too. */
#include <cstdio>

namespace geo {
struct Point {
    int x;
    __attribute__((noipa)) int norm(int k) const { return x * k + 1; }
};
}  // namespace geo

__attribute__((noipa)) int leaf(int n) { return n * 3 + 1; }

__attribute__((noipa)) int middle(int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += leaf(i);
    return s;
}

volatile long sink;

int main() {
    geo::Point p{3};
    long s = 0;
    for (int i = 0; i < 1000; i++) {
        s += middle(10);
        s += p.norm(i);
    }
    sink = s;
    printf("%ld\n", s);
    printf("EXPECT _Z4leafi 10000\nEXPECT _Z6middlei 1000\nEXPECT _ZNK3geo5Point4normEi 1000\n");
    return 0;
}
