#pragma once
// Shared benchmark plumbing (../shared/BENCH.md): timing statistics, the readable table and the
// JSON lines. Header-only; used by every bench/*_bench.cpp.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace troupe::bench {

using clock = std::chrono::steady_clock;

/// Seconds elapsed since t0.
inline double seconds_since(clock::time_point t0) {
  return std::chrono::duration<double>(clock::now() - t0).count();
}

/// Median / p99 / min / mean of a sample (in the sample's unit).
struct stats {
  double median = 0, p99 = 0, min = 0, mean = 0;
  std::size_t n = 0;
};

inline stats summarize(std::vector<double> v) {
  stats s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.n = v.size();
  s.median = v[v.size() / 2];
  s.p99 = v[std::min(v.size() - 1, static_cast<std::size_t>(static_cast<double>(v.size()) * 0.99))];
  s.min = v.front();
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  return s;
}

/// Runs `fn` `warmup` times, then `iters` times, returning each timed run in seconds.
inline std::vector<double> time_runs(int warmup, int iters, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(iters));
  for (int i = 0; i < iters; ++i) {
    const auto t0 = clock::now();
    fn();
    out.push_back(seconds_since(t0));
  }
  return out;
}

/// A command-line flag of a benchmark: its name, the value it takes ("" for a switch), what it does.
struct flag {
  const char* name;
  const char* value;
  const char* help;
};

/// Checks argv before a benchmark starts. `--quick` and `--help` are always known. --help prints
/// the usage to stdout and exits 0. An unknown flag or a missing value prints why and the usage
/// to stderr and exits 2.
inline void check_args(int argc, char** argv, const char* name, const char* what, std::vector<flag> flags = {}) {
  flags.insert(flags.begin(), {{"--quick", "", "a few-second smoke run (the figures mean nothing)"},
                               {"--help", "", "this text"}});
  auto usage = [&](std::FILE* to) {
    std::fprintf(to, "usage: %s [options]\n%s\n", name, what);
    for (const auto& f : flags) {
      const std::string head = std::string(f.name) + (*f.value ? std::string(" ") + f.value : "");
      std::fprintf(to, "  %-22s %s\n", head.c_str(), f.help);
    }
  };
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      std::exit(0);
    }
    const auto known =
        std::find_if(flags.begin(), flags.end(), [&](const flag& f) { return std::strcmp(f.name, argv[i]) == 0; });
    const char* why = known == flags.end()                 ? "unknown option"
                      : *known->value && i + 1 >= argc ? "missing value after"
                                                       : nullptr;
    if (why) {
      std::fprintf(stderr, "%s: %s %s\n", name, why, argv[i]);
      usage(stderr);
      std::exit(2);
    }
    if (*known->value) ++i;
  }
}

/// True when argv holds `--quick` (a few-second smoke run).
inline bool quick_mode(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--quick") == 0) return true;
  return false;
}

/// Collects metrics; prints the readable table and one JSON line per metric.
class report {
 public:
  explicit report(std::string bench) : bench_(std::move(bench)) {}

  /// Adds one metric; `params` is a JSON object body without braces, e.g. "\"iters\": 100".
  void add(const std::string& metric, double value, const std::string& unit, const std::string& params = "") {
    rows_.push_back({metric, value, unit, params});
    std::printf("{\"bench\": \"%s\", \"metric\": \"%s\", \"value\": %.6g, \"unit\": \"%s\", \"params\": {%s}}\n",
                bench_.c_str(), metric.c_str(), value, unit.c_str(), params.c_str());
    std::fflush(stdout);
  }

  /// Prints the readable table of everything added so far.
  void print_table() const {
    std::printf("\n%-44s %14s  %s\n", ("[" + bench_ + "] metric").c_str(), "value", "unit");
    for (const auto& r : rows_) std::printf("%-44s %14.4g  %s\n", r.metric.c_str(), r.value, r.unit.c_str());
    std::fflush(stdout);
  }

 private:
  struct row {
    std::string metric;
    double value;
    std::string unit;
    std::string params;
  };
  std::string bench_;
  std::vector<row> rows_;
};

}  // namespace troupe::bench
