#pragma once
// Ranks of a 2-host x 2-rank job started one by one with the launcher conventions. Marker files
// let the ranks and the test tell each other how far they got. There is no launcher:
// the partition tests cut the hosts off each other, launchers included.

#include <sys/stat.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "multihost/netns_bed.hpp"

namespace troupe::test {

/// The directory of a bed's marker files (made on first use, removed by the bed's owner test).
inline std::string mark_dir(const netns_bed& bed) {
  const std::string d = "/tmp/" + bed.prefix() + "-marks";
  ::mkdir(d.c_str(), 0755);
  return d;
}

/// Creates marker `name` in `dir`.
inline void set_mark(const std::string& dir, const std::string& name) {
  std::FILE* f = std::fopen((dir + "/" + name).c_str(), "w");
  if (f) std::fclose(f);
}

inline bool has_mark(const std::string& dir, const std::string& name) {
  struct stat st{};
  return ::stat((dir + "/" + name).c_str(), &st) == 0;
}

/// Waits (bounded) until every marker in `names` exists; false at the deadline.
inline bool await_marks(const std::string& dir, const std::vector<std::string>& names, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    bool all = true;
    for (const auto& n : names) all = all && has_mark(dir, n);
    if (all) return true;
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling files another process writes
  }
}

/// Starts ranks 0..3 of `tag` (rank r on host r / 2) with the launcher's variables set by hand.
inline std::vector<host_process> start_direct_ranks(netns_bed& bed, const std::string& tag, int port = 29500) {
  std::vector<host_process> ps;
  for (int r = 0; r < 4; ++r)
    ps.push_back(bed.start(r / 2, {self_exe(), tag},
                           {"RANK=" + std::to_string(r), "WORLD_SIZE=4", "LOCAL_RANK=" + std::to_string(r % 2), "MASTER_ADDR=" + netns_bed::addr(0),
                            "MASTER_PORT=" + std::to_string(port), "TROUPE_JOB_TOKEN=mh-direct", "MH_MARKS=" + mark_dir(bed)}));
  return ps;
}

/// The marker directory a rank was given.
inline std::string rank_marks() {
  const char* d = std::getenv("MH_MARKS");
  return d ? d : "/tmp";
}

}  // namespace troupe::test
