#include "stats.h"

#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <stdexcept>

int main()
{
    std::mt19937 rng(2024);
    std::uniform_real_distribution<double> dist(0.0, 100.0);
    std::vector<double> values(50000);
    for (auto &x : values)
        x = dist(rng);
    const char *pool[] = {"alpha", "beta", "gamma", "delta"};
    std::vector<std::string> words;
    for (int i = 0; i < 1000; i++)
        words.emplace_back(pool[rng() % 4]);
    Summary s = summarise(values, words);
    std::printf("mean %.6f median %.6f\n", s.mean, s.median);
    for (const auto &[w, n] : s.words)
        std::cout << w << ' ' << n << '\n';
    int caught = 0;
    for (int i = -2; i <= 2; i++) {
        try {
            std::cout << "ratio " << checked_ratio(10, i) << '\n';
        } catch (const std::domain_error &e) {
            caught++;
            std::cout << "caught " << e.what() << '\n';
        }
    }
    auto shared = std::make_shared<std::vector<int>>(10, 7);
    std::cout << "shared " << shared.use_count() << ' ' << (*shared)[9] << std::endl;
    return caught == 1 ? 6 : 1;
}
