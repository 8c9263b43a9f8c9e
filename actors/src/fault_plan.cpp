// The seeded fault plan (Note [fault plan] in fault_plan.hpp).
#include "troupe/actors/fault_plan.hpp"

#include <fstream>
#include <limits>
#include <sstream>

#include "troupe/tensors/error.hpp"

namespace troupe {

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Decision streams of one message (so adding a decision never shifts the others).
enum stream : std::uint32_t { s_drop = 1, s_duplicate = 2, s_delay = 3, s_reorder = 4 };

double parse_probability(const std::string& v, const std::string& field, int line) {
  std::size_t used = 0;
  double p = -1;
  try {
    p = std::stod(v, &used);
  } catch (const std::exception&) {
  }
  if (used != v.size() || !(p >= 0.0 && p <= 1.0))
    throw error(errc::bad_argument, "fault plan line " + std::to_string(line) + ": " + field + "=" + v + " is not a probability in [0, 1]");
  return p;
}

// A count in [0, max]: larger ones would not fit the field (fail_first is an int) or would
// overflow the arithmetic of a decision (delays are added up in milliseconds).
long parse_count(const std::string& v, const std::string& field, int line, long max) {
  std::size_t used = 0;
  long n = -1;
  try {
    n = std::stol(v, &used);
  } catch (const std::exception&) {
  }
  if (used != v.size() || n < 0 || n > max)
    throw error(errc::bad_argument, "fault plan line " + std::to_string(line) + ": " + field + "=" + v + " is not a count in [0, " +
                                        std::to_string(max) + "]");
  return n;
}

std::chrono::milliseconds parse_ms(const std::string& v, const std::string& field, int line) {
  return std::chrono::milliseconds(parse_count(v, field, line, fault_rule::max_delay_ms));
}

void parse_field(fault_rule& r, const std::string& kv, int line) {
  const auto eq = kv.find('=');
  if (eq == std::string::npos)
    throw error(errc::bad_argument, "fault plan line " + std::to_string(line) + ": '" + kv + "' is not key=value");
  const std::string k = kv.substr(0, eq), v = kv.substr(eq + 1);
  if (k == "fail_first") {
    r.fail_first = static_cast<int>(parse_count(v, k, line, std::numeric_limits<int>::max()));
  } else if (k == "drop") {
    r.drop = parse_probability(v, k, line);
  } else if (k == "drop_reply") {
    r.drop_reply = parse_probability(v, k, line);
  } else if (k == "duplicate") {
    r.duplicate = parse_probability(v, k, line);
  } else if (k == "reorder") {
    r.reorder = parse_ms(v, k, line);
  } else if (k == "delay") {
    const auto dots = v.find("..");
    const std::string lo = v.substr(0, dots), hi = dots == std::string::npos ? lo : v.substr(dots + 2);
    r.delay_min = parse_ms(lo, k, line);
    r.delay_max = parse_ms(hi, k, line);
    if (r.delay_max < r.delay_min)
      throw error(errc::bad_argument, "fault plan line " + std::to_string(line) + ": delay=" + v + " has max < min");
  } else {
    throw error(errc::bad_argument, "fault plan line " + std::to_string(line) + ": unknown field '" + k + "'");
  }
}

std::chrono::milliseconds uniform_ms(double u, std::chrono::milliseconds lo, std::chrono::milliseconds hi) {
  const auto span = hi.count() - lo.count() + 1;
  return lo + std::chrono::milliseconds(static_cast<long>(u * static_cast<double>(span)));
}

}  // namespace

double fault_random(std::uint64_t seed, const std::string& key, std::uint64_t n, std::uint32_t stream) {
  const std::uint64_t x = splitmix64(splitmix64(seed ^ fnv1a(key)) ^ (n * 0x2545f4914f6cdd1dULL) ^ stream);
  return static_cast<double>(x >> 11) * (1.0 / 9007199254740992.0);
}

fault_plan fault_plan::parse(const std::string& text) {
  fault_plan plan;
  std::istringstream in(text);
  std::string raw;
  int line = 0;
  while (std::getline(in, raw)) {
    ++line;
    if (const auto hash = raw.find('#'); hash != std::string::npos) raw.resize(hash);
    std::istringstream words(raw);
    std::string head;
    if (!(words >> head)) continue;
    if (head == "seed") {
      std::string v;
      words >> v;
      plan.seed = static_cast<std::uint64_t>(parse_count(v, "seed", line, std::numeric_limits<long>::max()));
    } else if (head == "rule") {
      fault_rule r;
      if (!(words >> r.match)) throw error(errc::bad_argument, "fault plan line " + std::to_string(line) + ": rule without a key");
      for (std::string kv; words >> kv;) parse_field(r, kv, line);
      plan.rules.push_back(std::move(r));
    } else {
      throw error(errc::bad_argument, "fault plan line " + std::to_string(line) + ": expected 'seed' or 'rule', got '" + head + "'");
    }
  }
  return plan;
}

fault_plan fault_plan::load(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw error(errc::io_error, "fault plan: cannot read " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return parse(s.str());
}

std::string fault_plan::to_string() const {
  std::ostringstream out;
  out.precision(17);
  out << "seed " << seed << "\n";
  for (const auto& r : rules) {
    out << "rule " << r.match << " fail_first=" << r.fail_first << " drop=" << r.drop << " drop_reply=" << r.drop_reply
        << " duplicate=" << r.duplicate << " delay=" << r.delay_min.count() << ".." << r.delay_max.count()
        << " reorder=" << r.reorder.count() << "\n";
  }
  return out.str();
}

fault_injector::fault_injector(fault_plan plan) : plan_(std::move(plan)) {}

const fault_rule* fault_injector::rule_for(message_kind kind, const std::string& function) const {
  const char* kind_key = kind == message_kind::rpc_request ? "rpc_request" : kind == message_kind::rpc_response ? "rpc_response" : "actor_message";
  for (const auto& r : plan_.rules)
    if (r.match == "*" || r.match == kind_key || (!function.empty() && r.match == function)) return &r;
  return nullptr;
}

std::string fault_injector::function_of(envelope& msg, bool forget) {
  auto it = calls_.find({msg.to, msg.call_id});
  if (it == calls_.end()) return {};
  std::string fn = it->second;
  if (forget) calls_.erase(it);
  return fn;
}

transport_decision fault_injector::on_receive(envelope& msg) {
  if (msg.kind == message_kind::rpc_request) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (calls_.size() > 1'000'000) calls_.clear();  // bound memory; unmatched replies fall back to kind rules
    calls_[{msg.from, msg.call_id}] = msg.function;
  }
  return {};
}

transport_decision fault_injector::on_send(envelope& msg) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++counters_.seen;
  // Actor messages are faulted as requests (Note [remote actors]: drop, fail_first, duplicate,
  // delay, reorder), keyed by their kind.
  const bool request = msg.kind != message_kind::rpc_response;
  const std::string function = msg.kind == message_kind::rpc_request ? msg.function : request ? std::string() : function_of(msg, true);
  const fault_rule* r = rule_for(msg.kind, function);
  if (!r) return {};
  const std::string key = (request ? "req:" : "rep:") + (function.empty() ? r->match : function);
  const std::uint64_t n = sequence_[key]++;
  transport_decision d;
  if (request && n < static_cast<std::uint64_t>(r->fail_first)) d.copies = 0;
  const double p_drop = request ? r->drop : r->drop_reply;
  if (p_drop > 0 && fault_random(plan_.seed, key, n, s_drop) < p_drop) d.copies = 0;
  if (d.copies == 0) {
    ++(request ? counters_.dropped_requests : counters_.dropped_replies);
    return d;
  }
  if (r->duplicate > 0 && fault_random(plan_.seed, key, n, s_duplicate) < r->duplicate) {
    d.copies = 2;
    ++counters_.duplicated;
  }
  if (r->delay_max.count() > 0) d.delay = uniform_ms(fault_random(plan_.seed, key, n, s_delay), r->delay_min, r->delay_max);
  if (r->reorder.count() > 0)
    d.delay += uniform_ms(fault_random(plan_.seed, key, n, s_reorder), std::chrono::milliseconds(0), r->reorder);
  if (d.delay.count() > 0) ++counters_.delayed;
  return d;
}

fault_counters fault_injector::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

}  // namespace troupe
