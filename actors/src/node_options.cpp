#include "troupe/actors/node_options.hpp"

#include <cstdlib>
#include <exception>
#include <random>

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
}  // namespace

node_options node_options::from_env() {
  node_options o;
  o.rank = static_cast<std::int32_t>(env_number("RANK", 0, 0, 1 << 20));
  o.world_size = static_cast<std::int32_t>(env_number("WORLD_SIZE", 1, 1, 1 << 20));
  o.local_rank = static_cast<std::int32_t>(env_number("LOCAL_RANK", 0, 0, 1 << 20));
  o.master_port = static_cast<std::uint16_t>(env_number("MASTER_PORT", 0, 0, 65535));
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) o.master_addr = a;
  if (const char* t = std::getenv("TROUPE_JOB_TOKEN")) o.job_token = t;
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
