#pragma once
// The options of troupe-run, parsed from torchrun's spellings (Note [launcher options]).
//
// Note [launcher options]
// Every flag takes its value as `--flag value` or `--flag=value`, with dashes or underscores
// (`--nproc-per-node`, `--nproc_per_node`). The program starts at the first argument that is not
// an option, or after `--`. torchrun's flags:
//   --nproc-per-node N   --nnodes N (or N:N)   --node-rank K   --master-addr A   --master-port P
//   --rdzv-endpoint A:P (master address and port)   --rdzv-backend static|c10d   --rdzv-id ID
//   --standalone (one node on loopback, a free port)   --max-restarts R
// --restart job|rank: what a restart starts again (Note [rank restart] in troupe_run.cpp).
// troupe-run's own:
//   --job-token T (or TROUPE_JOB_TOKEN)
//   --listen-addr A (or TROUPE_LISTEN_ADDR; default: the local address that routes to the master)
//   --tls-cert F --tls-key F --tls-ca F (or TROUPE_TLS_CERT, TROUPE_TLS_KEY, TROUPE_TLS_CA)
//   --timeout-s S   --join-timeout-s S
// Bad usage exits with code 2, as torchrun's argument parser does.

#include <string>
#include <vector>

namespace troupe::launcher {

struct launch_options {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string token;
  bool token_given = false;  ///< by flag or environment (a multi-node job needs one)
  std::string listen_addr;   ///< empty: the address that routes to the master
  /// --tls-cert/--tls-key/--tls-ca, else TROUPE_TLS_CERT/KEY/CA: mutual TLS on the launchers'
  /// channel (Note [launcher channel]), and passed to the ranks in the same variables.
  std::string tls_cert, tls_key, tls_ca;
  int max_restarts = 0;
  bool restart_rank = false;  ///< --restart rank: restart only the rank that died (one host)
  int timeout_s = 0;
  int join_timeout_s = 300;
  std::vector<std::string> command;

  bool multi_node() const { return nnodes > 1; }
};

/// Parses argv and the environment (TROUPE_JOB_TOKEN, TROUPE_LISTEN_ADDR, TROUPE_TLS_*). Prints the reason
/// and the usage and exits with code 2 on bad usage.
launch_options parse_options(int argc, char** argv);

}  // namespace troupe::launcher
