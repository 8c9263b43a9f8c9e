#include "launcher/launch_options.hpp"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <cstdlib>
#include <map>
#include <stdexcept>

namespace troupe::launcher {

namespace {

constexpr const char* usage_text =
    "usage: troupe-run --nproc-per-node N [--nnodes M --node-rank K] [--master-addr A --master-port P |\n"
    "                  --rdzv-endpoint A:P | --standalone] [--job-token T] [--listen-addr A]\n"
    "                  [--tls-cert F --tls-key F --tls-ca F]\n"
    "                  [--max-restarts R] [--restart job|rank] [--timeout-s S] [--join-timeout-s S] [--] prog args...\n"
    "Starts N ranks of prog on this host, like torchrun; each gets RANK, WORLD_SIZE, LOCAL_RANK,\n"
    "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TROUPE_JOB_TOKEN, TROUPE_LISTEN_ADDR and\n"
    "TROUPE_RESTART_COUNT. Flags take '--flag value' or '--flag=value', with '-' or '_'.\n"
    "  --nproc-per-node N   ranks on this host (default 1)\n"
    "  --nnodes M           hosts in the job (default 1)\n"
    "  --node-rank K        this host's index, 0 to M-1 (default 0)\n"
    "  --master-addr A      address of node 0 (default 127.0.0.1)\n"
    "  --master-port P      node 0's port; 0 picks a free one, one host only (default 0)\n"
    "  --rdzv-endpoint A:P  the same as --master-addr A --master-port P\n"
    "  --standalone         one host on loopback with a free port\n"
    "  --job-token T        shared secret of the job (default: TROUPE_JOB_TOKEN; random on one host,\n"
    "                       required on several)\n"
    "  --listen-addr A      address the ranks bind (default: TROUPE_LISTEN_ADDR, else the local\n"
    "                       address that routes to the master; 0.0.0.0 binds every interface)\n"
    "  --tls-cert F, --tls-key F, --tls-ca F  PEM files of mutual TLS (docs/tls.md) on the launchers'\n"
    "                       channel and, through TROUPE_TLS_CERT, TROUPE_TLS_KEY, TROUPE_TLS_CA, on\n"
    "                       the ranks' connections (default: those variables)\n"
    "  --max-restarts R     start every rank of the job again after a failure, up to R times for\n"
    "                       the whole job (the master's value counts on several nodes)\n"
    "  --restart job|rank   what a restart starts again: every rank (job, the default), or only the\n"
    "                       rank that died (rank: live recovery on one host; the replacement gets\n"
    "                       TROUPE_REPLACEMENT=1, the survivors keep running; rank 0 hosts the\n"
    "                       store, so its death restarts the job)\n"
    "  --timeout-s S        stop every rank after S seconds and exit 124; 0 means none (default 0)\n"
    "  --join-timeout-s S   how long the hosts wait for each other at start (default 300)\n"
    "  --help               this text\n"
    "A failure on any host stops every rank on every host and is named (rank, host, cause);\n"
    "the launchers then exit 1 (0: success, 2: bad usage).\n";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "troupe-run: %s\n%s", why.c_str(), usage_text);
  std::exit(2);
}

// An empty `field` takes the value of the environment variable `name`, when set.
void from_env(std::string& field, const char* name) {
  if (field.empty())
    if (const char* env = std::getenv(name); env && *env) field = env;
}

int parse_int(const std::string& flag, const std::string& text, int min) {
  std::size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || v < min) usage(flag + " needs an integer >= " + std::to_string(min) + ", got '" + text + "'");
  return v;
}

// "--nproc_per_node" and "--nproc-per-node" are the same flag.
std::string canonical(std::string flag) {
  for (std::size_t i = 2; i < flag.size(); ++i)
    if (flag[i] == '_') flag[i] = '-';
  return flag;
}

// torchrun's elastic form "MIN:MAX" is accepted only with MIN == MAX.
int parse_nnodes(const std::string& v) {
  const auto colon = v.find(':');
  if (colon == std::string::npos) return parse_int("--nnodes", v, 1);
  const int lo = parse_int("--nnodes", v.substr(0, colon), 1);
  if (parse_int("--nnodes", v.substr(colon + 1), 1) != lo) usage("--nnodes " + v + ": elastic node counts are not supported, give one number");
  return lo;
}

void parse_endpoint(launch_options& o, const std::string& v) {
  const auto colon = v.rfind(':');
  if (colon == std::string::npos || colon == 0) usage("--rdzv-endpoint needs host:port, got '" + v + "'");
  o.master_addr = v.substr(0, colon);
  o.master_port = parse_int("--rdzv-endpoint", v.substr(colon + 1), 0);
}

// Applies one flag with its value; returns false for an unknown flag.
bool apply(launch_options& o, const std::string& f, const std::string& v) {
  if (f == "--nproc-per-node") o.nproc = parse_int(f, v, 1);
  else if (f == "--nnodes") o.nnodes = parse_nnodes(v);
  else if (f == "--node-rank") o.node_rank = parse_int(f, v, 0);
  else if (f == "--master-addr") o.master_addr = v;
  else if (f == "--master-port") o.master_port = parse_int(f, v, 0);
  else if (f == "--rdzv-endpoint") parse_endpoint(o, v);
  else if (f == "--rdzv-backend") {
    if (v != "static" && v != "c10d") usage("--rdzv-backend " + v + " is not supported (static or c10d)");
  } else if (f == "--rdzv-id") {
  } else if (f == "--job-token") {
    o.token = v;
    o.token_given = true;
  } else if (f == "--listen-addr") o.listen_addr = v;
  else if (f == "--tls-cert") o.tls_cert = v;
  else if (f == "--tls-key") o.tls_key = v;
  else if (f == "--tls-ca") o.tls_ca = v;
  else if (f == "--max-restarts") o.max_restarts = parse_int(f, v, 0);
  else if (f == "--restart") {
    if (v != "job" && v != "rank") usage("--restart needs job or rank, got '" + v + "'");
    o.restart_rank = v == "rank";
  } else if (f == "--timeout-s") o.timeout_s = parse_int(f, v, 0);
  else if (f == "--join-timeout-s") o.join_timeout_s = parse_int(f, v, 1);
  else return false;
  return true;
}

void validate(const launch_options& o, bool standalone) {
  if (o.command.empty()) usage("no program given");
  if (standalone && o.nnodes > 1) usage("--standalone runs one node; drop --nnodes " + std::to_string(o.nnodes));
  if (o.node_rank >= o.nnodes) usage("--node-rank must be below --nnodes");
  if (o.multi_node() && o.restart_rank) usage("--restart rank runs on one host; drop --nnodes " + std::to_string(o.nnodes));
  if (o.multi_node() && o.master_port == 0) usage("--master-port (or --rdzv-endpoint host:port) must be given when --nnodes > 1");
  if (o.multi_node() && !o.token_given)
    usage("a job on " + std::to_string(o.nnodes) +
          " nodes needs one job token on every node: pass the same --job-token T to every troupe-run, or export "
          "TROUPE_JOB_TOKEN (for example TROUPE_JOB_TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \\n'))");
}

}  // namespace

launch_options parse_options(int argc, char** argv) {
  launch_options o;
  bool standalone = false;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "--help" || a == "-h") {
      std::fputs(usage_text, stdout);
      std::exit(0);
    }
    if (a.rfind("--", 0) != 0) break;  // the program
    const auto eq = a.find('=');
    const std::string flag = canonical(a.substr(0, eq));
    if (flag == "--standalone") {
      standalone = true;
      continue;
    }
    static const char* const known[] = {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
                                        "--rdzv-endpoint", "--rdzv-backend", "--rdzv-id", "--job-token", "--listen-addr", "--tls-cert", "--tls-key", "--tls-ca",
                                        "--max-restarts", "--restart", "--timeout-s", "--join-timeout-s"};
    if (std::find(std::begin(known), std::end(known), flag) == std::end(known)) usage("unknown option " + a);
    std::string value;
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else {
      if (i + 1 >= argc) usage("missing value after " + a);
      value = argv[++i];
    }
    if (!apply(o, flag, value)) usage("unknown option " + a);
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);
  if (standalone) {
    o.master_addr = "127.0.0.1";
    o.master_port = 0;
  }
  if (!o.token_given) {
    if (const char* env = std::getenv("TROUPE_JOB_TOKEN"); env && *env) {
      o.token = env;
      o.token_given = true;
    }
  }
  if (o.listen_addr.empty())
    if (const char* env = std::getenv("TROUPE_LISTEN_ADDR"); env && *env) o.listen_addr = env;
  from_env(o.tls_cert, "TROUPE_TLS_CERT");
  from_env(o.tls_key, "TROUPE_TLS_KEY");
  from_env(o.tls_ca, "TROUPE_TLS_CA");
  validate(o, standalone);
  return o;
}

}  // namespace troupe::launcher
