#include "stats.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

Summary summarise(const std::vector<double> &values, const std::vector<std::string> &words)
{
    Summary s{};
    std::vector<double> v(values);
    std::sort(v.begin(), v.end());
    s.mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
    s.median = v[v.size() / 2];
    for (const auto &w : words)
        ++s.words[w];
    return s;
}

double checked_ratio(double a, double b)
{
    if (b == 0)
        throw std::domain_error("division by zero");
    return a / b;
}
