// Rule keys of collective payloads (collective_faults.hpp).
#include "collective_faults.hpp"

#include <array>
#include <charconv>
#include <string>

#include "troupe/tensors/error.hpp"

namespace troupe::detail {

namespace {

constexpr std::string_view prefix = "collective";
constexpr std::array<std::string_view, 10> kinds = {"allreduce", "broadcast", "allgather", "reduce_scatter", "reduce",
                                                     "gather",    "scatter",   "all_to_all", "barrier",       "send"};

bool is_kind(std::string_view k) {
  for (auto n : kinds)
    if (n == k) return true;
  return false;
}

// "seq=12" -> 12 under `name`; nullopt when `part` is not `name=`.
bool number_of(std::string_view part, std::string_view name, long long& out) {
  if (part.size() <= name.size() + 1 || part.substr(0, name.size()) != name || part[name.size()] != '=') return false;
  const auto v = part.substr(name.size() + 1);
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  return ec == std::errc() && end == v.data() + v.size() && out >= 0;
}

// Calls fn(part) for each ':'-separated part after the prefix; stops at the first false.
template <class Fn>
bool each_part(std::string_view match, Fn&& fn) {
  std::string_view rest = match.substr(prefix.size());
  while (!rest.empty()) {
    rest.remove_prefix(1);  // the ':'
    const auto colon = rest.find(':');
    if (!fn(rest.substr(0, colon))) return false;
    rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon);
  }
  return true;
}

}  // namespace

bool is_collective_key(std::string_view match) noexcept {
  return match.substr(0, prefix.size()) == prefix && (match.size() == prefix.size() || match[prefix.size()] == ':');
}

void check_collective_rule(const fault_rule& r, int line) {
  const std::string at = "fault plan line " + std::to_string(line) + ": rule " + r.match + ": ";
  each_part(r.match, [&](std::string_view part) {
    long long n = 0;
    if (is_kind(part) || number_of(part, "seq", n) || number_of(part, "rank", n) || number_of(part, "bucket", n)) return true;
    throw error(errc::bad_argument, at + "'" + std::string(part) +
                                        "' is neither a collective (allreduce, broadcast, allgather, reduce_scatter, reduce, gather, "
                                        "scatter, all_to_all, barrier, send) nor seq=N, rank=R or bucket=B");
  });
  if (r.drop_reply > 0)
    throw error(errc::bad_argument, at + "drop_reply has no meaning for a collective payload: a collective has no reply to lose (use drop)");
}

bool collective_key_matches(std::string_view match, const envelope& msg) {
  if (!is_collective_key(match)) return false;
  const std::string_view note(msg.payload.data(), msg.payload.size());
  return each_part(match, [&](std::string_view part) {
    long long n = 0;
    if (number_of(part, "seq", n)) return static_cast<std::uint64_t>(n) == msg.call_id;
    if (number_of(part, "rank", n)) return msg.from == "rank " + std::to_string(n);
    if (number_of(part, "bucket", n)) return note == "bucket " + std::to_string(n);
    return part == msg.function;
  });
}

}  // namespace troupe::detail
