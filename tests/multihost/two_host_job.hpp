#pragma once
// A job of 2 namespace hosts x 2 ranks started with one troupe-run per host, and the rank side's
// helpers: the rank's node options from the launcher environment.

#include <chrono>
#include <string>
#include <vector>

#include "multihost/netns_bed.hpp"

namespace troupe::test {

/// What every launcher of a job did.
struct job_result {
  std::vector<int> codes;            ///< exit code per host (-1: still running at the bound)
  std::vector<std::string> outputs;  ///< per host
  std::string all() const {
    std::string s;
    for (std::size_t h = 0; h < outputs.size(); ++h) s += "--- host " + std::to_string(h) + " ---\n" + outputs[h];
    return s;
  }
};

/// The launcher command of host `h` of a 2-host x `nproc` job (token from the environment).
inline std::vector<std::string> launcher_argv(const netns_bed& bed, int h, int nproc, const std::vector<std::string>& program,
                                              int timeout_s, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a{TROUPE_RUN_PATH, "--nnodes=2", "--node_rank", std::to_string(h), "--nproc-per-node", std::to_string(nproc),
                             "--rdzv-endpoint", netns_bed::addr(0) + ":29400", "--timeout-s", std::to_string(timeout_s),
                             "--join-timeout-s", "30"};
  a.insert(a.end(), extra.begin(), extra.end());
  a.push_back("--");
  a.insert(a.end(), program.begin(), program.end());
  return a;
}

/// Runs `program` as a job of 2 hosts x 2 ranks; waits (bounded by `bound`) for both launchers.
inline job_result run_two_host_job(netns_bed& bed, const std::vector<std::string>& program,
                                   std::chrono::seconds bound = std::chrono::seconds(60), const std::vector<std::string>& extra = {}) {
  std::vector<host_process> ps;
  for (int h = 0; h < 2; ++h)
    ps.push_back(bed.start(h, launcher_argv(bed, h, 2, program, static_cast<int>(bound.count()), extra), {"TROUPE_JOB_TOKEN=mh-job-token"}));
  job_result r;
  for (auto& p : ps) r.codes.push_back(p.wait(bound + std::chrono::seconds(10)));
  for (auto& p : ps) r.outputs.push_back(p.output());
  return r;
}

/// This test binary running only the hidden test case `tag` (one rank of a job).
inline std::vector<std::string> rank_program(const std::string& tag) { return {self_exe(), tag}; }

}  // namespace troupe::test
