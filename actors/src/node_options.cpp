#include "troupe/actors/node_options.hpp"

#include <cstdlib>
#include <exception>
#include <random>

#include "troupe/actors/host_address.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe {

namespace {
long env_number(const char* name, long fallback, long lo, long hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > hi)
    throw error(errc::bad_argument, std::string("environment variable ") + name + "='" + v + "' is not a number in [" +
                                        std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return x;
}

const char* env_text(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// Slurm's conventions, used when no launcher set RANK (srun starts every task itself).
void read_slurm(node_options& o) {
  o.rank = static_cast<std::int32_t>(env_number("SLURM_PROCID", 0, 0, 1 << 20));
  o.world_size = static_cast<std::int32_t>(env_number("SLURM_NTASKS", 1, 1, 1 << 20));
  o.local_rank = static_cast<std::int32_t>(env_number("SLURM_LOCALID", 0, 0, 1 << 20));
  if (const char* list = env_text("SLURM_JOB_NODELIST")) o.master_addr = first_slurm_host(list);
  const long job = env_number("SLURM_JOB_ID", 0, 0, 1L << 40);
  o.master_port = static_cast<std::uint16_t>(29500 + job % 1000);
}

}  // namespace

node_options node_options::from_env() {
  node_options o;
  if (!env_text("RANK") && env_text("SLURM_PROCID")) {
    read_slurm(o);
  } else {
    o.rank = static_cast<std::int32_t>(env_number("RANK", 0, 0, 1 << 20));
    o.world_size = static_cast<std::int32_t>(env_number("WORLD_SIZE", 1, 1, 1 << 20));
    o.local_rank = static_cast<std::int32_t>(env_number("LOCAL_RANK", 0, 0, 1 << 20));
  }
  o.master_port = static_cast<std::uint16_t>(env_number("MASTER_PORT", o.master_port, 0, 65535));
  if (const char* a = env_text("MASTER_ADDR")) o.master_addr = a;
  if (const char* t = std::getenv("TROUPE_JOB_TOKEN")) o.job_token = t;
  if (const char* d = env_text("TROUPE_TRACE")) o.trace_dir = d;
  if (const char* c = env_text("TROUPE_TLS_CERT")) o.tls.cert_file = c;
  if (const char* k = env_text("TROUPE_TLS_KEY")) o.tls.key_file = k;
  if (const char* a = env_text("TROUPE_TLS_CA")) o.tls.ca_file = a;
  if (const char* l = env_text("TROUPE_LISTEN_ADDR")) o.listen_addr = l;
  else if (!is_loopback_address(o.master_addr)) o.listen_addr = routable_address(o.master_addr);
  return o;
}

std::string node_options::random_token() {
  static const char* hex = "0123456789abcdef";
  std::string s;
  try {
    std::random_device rd;
    for (int i = 0; i < 4; ++i)
      for (auto v = rd(), k = 0u; k < 8; ++k) s += hex[(v >> (4 * k)) & 0xf];
  } catch (const std::exception& e) {
    throw error(errc::io_error, std::string("cannot make a random job token: ") + e.what());
  }
  return s;
}

}  // namespace troupe
