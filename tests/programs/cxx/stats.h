#pragma once
#include <map>
#include <string>
#include <vector>

struct Summary {
    double mean;
    double median;
    std::map<std::string, int> words;
};

Summary summarise(const std::vector<double> &values, const std::vector<std::string> &words);
double checked_ratio(double a, double b);
