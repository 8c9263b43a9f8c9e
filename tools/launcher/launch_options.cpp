#include "launcher/launch_options.hpp"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>

namespace troupe::launcher {

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "troupe-run: %s\n"
               "usage: troupe-run --nproc-per-node N [--nnodes M --node-rank K] [--master-addr A --master-port P |\n"
               "                  --rdzv-endpoint A:P | --standalone] [--job-token T] [--listen-addr A]\n"
               "                  [--max-restarts R] [--timeout-s S] [--join-timeout-s S] [--] prog args...\n",
               why.c_str());
  std::exit(2);
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
  else if (f == "--max-restarts") o.max_restarts = parse_int(f, v, 0);
  else if (f == "--timeout-s") o.timeout_s = parse_int(f, v, 0);
  else if (f == "--join-timeout-s") o.join_timeout_s = parse_int(f, v, 1);
  else return false;
  return true;
}

void validate(const launch_options& o, bool standalone) {
  if (o.command.empty()) usage("no program given");
  if (standalone && o.nnodes > 1) usage("--standalone runs one node; drop --nnodes " + std::to_string(o.nnodes));
  if (o.node_rank >= o.nnodes) usage("--node-rank must be below --nnodes");
  if (o.multi_node() && o.master_port == 0) usage("--master-port (or --rdzv-endpoint host:port) must be given when --nnodes > 1");
  if (o.multi_node() && o.max_restarts > 0) usage("--max-restarts needs --nnodes 1 (restarts across nodes are not supported)");
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
    if (a.rfind("--", 0) != 0) break;  // the program
    const auto eq = a.find('=');
    const std::string flag = canonical(a.substr(0, eq));
    if (flag == "--standalone") {
      standalone = true;
      continue;
    }
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
  validate(o, standalone);
  return o;
}

}  // namespace troupe::launcher
