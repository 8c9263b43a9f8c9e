#pragma once
// Helpers shared by the examples that run a job under the launcher, kill its ranks and compare
// the result with an undisturbed run (supervised_faults, live_recovery). They cover flag
// parsing, the job's timeline file, shell quoting and the bitwise comparison of final parameters.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "troupe/autograd.hpp"

namespace troupe::examples {

/// The integer `text` of `flag`; bad_argument naming both when it is not one.
inline int integer(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw error(errc::bad_argument, flag + " needs an integer, got '" + text + "'");
  return v;
}

/// Wall-clock milliseconds (the ranks of a job share the clock).
inline double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(system_clock::now().time_since_epoch()).count();
}

/// Appends one timestamped line to `out`/timeline.txt (O_APPEND: lines of ranks never mix).
inline void timeline(const std::string& out, const std::string& text) {
  const int fd = ::open((std::filesystem::path(out) / "timeline.txt").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd < 0) return;
  char buf[512];
  const int n = std::snprintf(buf, sizeof buf, "%.3f %s\n", now_ms(), text.c_str());
  if (n > 0 && ::write(fd, buf, static_cast<std::size_t>(std::min(n, 511))) < 0) {}
  ::close(fd);
}

/// `s` quoted for a POSIX shell.
inline std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

/// Prints `dir`/timeline.txt in time order, as milliseconds after `t0`.
inline void print_timeline(const std::string& dir, double t0) {
  std::ifstream in(std::filesystem::path(dir) / "timeline.txt");
  std::vector<std::pair<double, std::string>> lines;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    double t = 0;
    ls >> t;
    std::string rest;
    std::getline(ls, rest);
    lines.emplace_back(t, rest);
  }
  std::sort(lines.begin(), lines.end());
  std::printf("timeline of the faulty run:\n");
  for (const auto& [t, text] : lines) std::printf("  %9.1f ms %s\n", t - t0, text.c_str());
}

/// True when `a` and `b` hold the same names with the same dtypes and bytes.
inline bool same_bits(const state_dict& a, const state_dict& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    const auto it = b.find(name);
    if (it == b.end() || it->second.nbytes() != t.nbytes() || it->second.dtype() != t.dtype()) return false;
    if (std::memcmp(it->second.data_ptr(), t.data_ptr(), t.nbytes()) != 0) return false;
  }
  return true;
}

}  // namespace troupe::examples
