#pragma once
/// \file cluster.hpp
/// A test fixture that runs a job of N ranks as local processes under a fault plan. It checks
/// the job's invariants (Note [cluster fixture]).
///
///   troupe::testing::cluster_options o;
///   o.world = 3;
///   o.plan_file = "plan.txt";  // TROUPE_FAULTS of every rank
///   auto r = troupe::testing::run_cluster(o, [](troupe::node& n) { ...; return 0; });
///   REQUIRE(r.finished_in_bound());
///   CHECK(r.leaks.empty());
///
/// Note [cluster fixture]
///
/// Each rank is a forked process in its own process group. It starts a node on loopback, or on
/// its namespace host (below). Rank 0 starts first and hands its port to the others through a
/// pipe. Each rank runs the job and exits with the job's code. A troupe::error escaping the job
/// prints its message and exits with 2. Under a sanitizer build, a rank whose job returned 0 but
/// leaked exits with 23 (LeakSanitizer's code).
/// The parent waits for every rank up to `bound`; past it, every group is SIGKILLed and the
/// result says so. Then it checks what was left. That is a process of a rank's group still
/// running 2 s after the ranks ended (a helper), or a new /dev/shm/troupe* segment whose name
/// carries a rank's pid. A zombie waiting for its reaper does not count. Segments of other
/// processes on the machine are not counted. Every child is reaped before run_cluster returns.
///
/// Namespace hosts (cluster_options::hosts, e.g. the hosts of tools/netns_bed.sh; needs root).
/// The ranks go on the hosts in blocks, rank r on hosts[r * hosts.size() / world]. Right after
/// the fork, a rank enters the host's network namespace. It also enters a UTS namespace of its
/// own named after the host, so host identity, as the process groups see it, differs between
/// hosts. Then its node listens on the host's address; the master is rank 0's host. A rank that
/// cannot enter its host exits with 2 naming the namespace. Faults between hosts (cuts,
/// freezes) are the bed's.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "troupe/actors/node.hpp"

namespace troupe::testing {

/// One host of a cluster on network namespaces.
struct cluster_host {
  std::string netns;    ///< a network namespace under /run/netns (`ip netns`); also the host's name
  std::string address;  ///< the host's IPv4 address in it (its ranks listen there)
};

/// How to run a cluster.
struct cluster_options {
  int world = 2;                                  ///< number of ranks
  std::chrono::milliseconds bound{30000};         ///< the whole job's time limit
  std::string plan_file;                          ///< TROUPE_FAULTS of every rank; empty: none
  std::string job_token = "troupe-cluster";       ///< the job token
  std::chrono::milliseconds call_timeout{10000};  ///< node_options::default_timeout
  std::chrono::milliseconds peer_timeout{1000};   ///< node_options::connection_timeout (a frozen peer is lost after it)
  std::vector<cluster_host> hosts;                ///< namespace hosts of the ranks; empty: loopback here
};

/// How one rank ended.
struct rank_outcome {
  int rank = 0;
  bool exited = false;  ///< exited normally (else killed by `signal`, or never ended)
  int exit_code = -1;
  int signal = 0;
};

/// What a cluster run did.
struct cluster_result {
  std::vector<rank_outcome> ranks;
  bool timed_out = false;           ///< some rank had not ended within the bound
  std::vector<std::string> leaks;   ///< left-over processes and shared-memory segments
  std::chrono::milliseconds took{0};

  /// No rank ran past the bound.
  bool finished_in_bound() const { return !timed_out; }
  /// Every rank exited with code 0.
  bool all_succeeded() const;
  /// One line per rank and per leak, for failure messages.
  std::string describe() const;
};

/// Runs `job` on every rank (Note [cluster fixture]). Blocks up to options.bound plus a few
/// seconds of teardown. Throws troupe::error(bad_argument) for a world below 1 or a host with an
/// empty field, io_error when it cannot fork or make a pipe.
cluster_result run_cluster(const cluster_options& options, const std::function<int(node&)>& job);

}  // namespace troupe::testing
