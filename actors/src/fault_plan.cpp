// The seeded fault plan (Note [fault plan] in fault_plan.hpp).
#include "troupe/actors/fault_plan.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <limits>
#include <sstream>
#include <string_view>
#include <thread>

#include "collective_faults.hpp"
#include "troupe/actors/node.hpp"
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

// A count in [0, max]. A larger one would not fit the field (fail_first is an int). Or it would
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
  } else if (k == "nth") {
    r.nth = static_cast<int>(parse_count(v, k, line, std::numeric_limits<int>::max()));
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

std::vector<std::string> split_names(const std::string& v) {
  std::vector<std::string> out;
  std::istringstream in(v);
  for (std::string w; std::getline(in, w, ',');)
    if (!w.empty()) out.push_back(w);
  return out;
}

std::string line_prefix(int line) { return "fault plan line " + std::to_string(line) + ": "; }

// `partition A B [for=MS] [hold]` (Note [fault events]).
fault_partition parse_partition(std::istringstream& words, int line) {
  fault_partition p;
  std::string a, b;
  if (!(words >> a >> b)) throw error(errc::bad_argument, line_prefix(line) + "partition needs two worker lists");
  p.side_a = split_names(a);
  p.side_b = split_names(b);
  if (p.side_a.empty() || p.side_b.empty()) throw error(errc::bad_argument, line_prefix(line) + "partition needs two worker lists");
  for (std::string w; words >> w;) {
    if (w == "hold") p.hold = true;
    else if (w.rfind("for=", 0) == 0) p.duration = parse_ms(w.substr(4), "for", line);
    else throw error(errc::bad_argument, line_prefix(line) + "unknown partition field '" + w + "'");
  }
  if (p.hold && p.duration.count() == 0) throw error(errc::bad_argument, line_prefix(line) + "a held partition needs for=MS");
  return p;
}

// `drop_heartbeats A B [for=MS]` (Note [fault events]).
fault_silence parse_silence(std::istringstream& words, int line) {
  fault_silence s;
  std::string a, b;
  if (!(words >> a >> b)) throw error(errc::bad_argument, line_prefix(line) + "drop_heartbeats needs two worker lists");
  s.from = split_names(a);
  s.to = split_names(b);
  if (s.from.empty() || s.to.empty()) throw error(errc::bad_argument, line_prefix(line) + "drop_heartbeats needs two worker lists");
  for (std::string w; words >> w;) {
    if (w.rfind("for=", 0) == 0) s.duration = parse_ms(w.substr(4), "for", line);
    else throw error(errc::bad_argument, line_prefix(line) + "unknown drop_heartbeats field '" + w + "'");
  }
  return s;
}

const char* action_name(point_action a) { return a == point_action::kill ? "kill" : a == point_action::pause ? "pause" : "delay"; }

// `kill POINT step=N [worker=W]`, `pause|delay POINT step=N for=MS [worker=W]`.
fault_point_event parse_point(point_action action, std::istringstream& words, int line) {
  fault_point_event e;
  e.action = action;
  const char* what = action_name(action);
  if (!(words >> e.point) || e.point.find('=') != std::string::npos)
    throw error(errc::bad_argument, line_prefix(line) + what + " needs a point name");
  bool has_step = false;
  for (std::string w; words >> w;) {
    if (w.rfind("step=", 0) == 0) {
      e.step = parse_count(w.substr(5), "step", line, std::numeric_limits<long>::max());
      has_step = true;
    } else if (w.rfind("worker=", 0) == 0 && w.size() > 7) {
      e.worker = w.substr(7);
    } else if (w.rfind("for=", 0) == 0 && action != point_action::kill) {
      e.duration = parse_ms(w.substr(4), "for", line);
    } else {
      throw error(errc::bad_argument, line_prefix(line) + "unknown " + what + " field '" + w + "'");
    }
  }
  if (!has_step) throw error(errc::bad_argument, line_prefix(line) + what + " needs step=N");
  if (action != point_action::kill && e.duration.count() == 0) throw error(errc::bad_argument, line_prefix(line) + what + " needs for=MS");
  return e;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& w : v) out += (out.empty() ? "" : ",") + w;
  return out;
}

bool contains(const std::vector<std::string>& v, const std::string& w) { return std::find(v.begin(), v.end(), w) != v.end(); }

// Stops this process for `d`: a forked helper sleeps and sends SIGCONT; the helper only makes
// async-signal-safe calls. Returns once continued, after reaping the helper.
void pause_self(std::chrono::milliseconds d) {
  const pid_t parent = ::getpid();
  const pid_t helper = ::fork();
  if (helper < 0) throw error(errc::io_error, "fault plan: cannot fork the pause helper");
  if (helper == 0) {
    timespec ts{static_cast<time_t>(d.count() / 1000), static_cast<long>(d.count() % 1000) * 1'000'000L};
    while (::nanosleep(&ts, &ts) != 0) {
    }
    ::kill(parent, SIGCONT);
    ::_exit(0);
  }
  ::kill(parent, SIGSTOP);
  int status = 0;
  while (::waitpid(helper, &status, 0) < 0 && errno == EINTR) {
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
      if (detail::is_collective_key(r.match)) detail::check_collective_rule(r, line);
      plan.rules.push_back(std::move(r));
    } else if (head == "partition") {
      plan.partitions.push_back(parse_partition(words, line));
    } else if (head == "kill" || head == "pause" || head == "delay") {
      const auto action = head == "kill" ? point_action::kill : head == "pause" ? point_action::pause : point_action::delay;
      plan.points.push_back(parse_point(action, words, line));
    } else if (head == "drop_heartbeats") {
      plan.silences.push_back(parse_silence(words, line));
    } else {
      throw error(errc::bad_argument, line_prefix(line) + "expected 'seed', 'rule', 'partition', 'drop_heartbeats', 'kill', 'pause' or 'delay', got '" +
                                          head + "'");
    }
  }
  return plan;
}

fault_plan fault_plan::load(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw error(errc::io_error, "fault plan: cannot read " + path);
  std::ostringstream s;
  s << f.rdbuf();
  try {
    return parse(s.str());
  } catch (const error& e) {
    throw error(e.code(), path + ": " + e.message());
  }
}

std::string fault_plan::to_string() const {
  std::ostringstream out;
  out.precision(17);
  out << "seed " << seed << "\n";
  for (const auto& r : rules) {
    out << "rule " << r.match << " fail_first=" << r.fail_first << " nth=" << r.nth << " drop=" << r.drop << " drop_reply=" << r.drop_reply
        << " duplicate=" << r.duplicate << " delay=" << r.delay_min.count() << ".." << r.delay_max.count()
        << " reorder=" << r.reorder.count() << "\n";
  }
  for (const auto& p : partitions)
    out << "partition " << join(p.side_a) << " " << join(p.side_b) << " for=" << p.duration.count() << (p.hold ? " hold" : "") << "\n";
  for (const auto& h : silences) out << "drop_heartbeats " << join(h.from) << " " << join(h.to) << " for=" << h.duration.count() << "\n";
  for (const auto& e : points) {
    out << action_name(e.action) << " " << e.point << " step=" << e.step;
    if (!e.worker.empty()) out << " worker=" << e.worker;
    if (e.action != point_action::kill) out << " for=" << e.duration.count();
    out << "\n";
  }
  return out.str();
}

fault_injector::fault_injector(fault_plan plan, log_sink log) : plan_(std::move(plan)), log_(std::move(log)) {
  if (log_) log_("troupe-fault: plan seed " + std::to_string(plan_.seed) + ", " + std::to_string(plan_.rules.size()) + " rules, " +
                 std::to_string(plan_.partitions.size()) + " partitions, " + std::to_string(plan_.points.size()) + " point events, " + std::to_string(plan_.silences.size()) + " heartbeat losses");
}

fault_injector::~fault_injector() {
  const auto c = counters();
  log("troupe-fault: summary seen=" + std::to_string(c.seen) + " dropped_requests=" + std::to_string(c.dropped_requests) +
      " dropped_replies=" + std::to_string(c.dropped_replies) + " duplicated=" + std::to_string(c.duplicated) +
      " delayed=" + std::to_string(c.delayed) + " partitioned=" + std::to_string(c.partitioned) + " held=" + std::to_string(c.held) +
      " points_fired=" + std::to_string(c.points_fired));
}

fault_injector::log_sink fault_injector::stderr_log() {
  return [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
}

void fault_injector::log(const std::string& line) {
  if (log_) log_(line);
}

void fault_injector::heal() {
  std::lock_guard<std::mutex> lock(mutex_);
  healed_ = std::chrono::steady_clock::now();
  log("troupe-fault: heal");
}

// Note [fault events]: a message between the two sides of a live cut is dropped or held.
// Called under mutex_.
bool fault_injector::partition_decision(const envelope& msg, transport_decision& d) {
  const auto now = std::chrono::steady_clock::now();
  if (now >= healed_) return false;
  for (const auto& p : plan_.partitions) {
    const bool across = (contains(p.side_a, msg.from) && contains(p.side_b, msg.to)) || (contains(p.side_b, msg.from) && contains(p.side_a, msg.to));
    if (!across) continue;
    const auto end = p.duration.count() == 0 ? healed_ : std::min(healed_, start_ + p.duration);
    if (now >= end) continue;
    if (p.hold) {
      d.delay = std::chrono::duration_cast<std::chrono::milliseconds>(end - now) + std::chrono::milliseconds(1);
      ++counters_.held;
      log("troupe-fault: hold " + msg.from + "->" + msg.to + " " + std::to_string(d.delay.count()) + "ms");
    } else {
      d.copies = 0;
      ++counters_.partitioned;
      log("troupe-fault: cut " + msg.from + "->" + msg.to);
    }
    return true;
  }
  return false;
}

void fault_injector::on_point(const std::string& worker, const std::string& point, std::int64_t step) {
  const fault_point_event* hit = nullptr;
  for (const auto& e : plan_.points)
    if (e.point == point && e.step == step && (e.worker.empty() || e.worker == worker)) hit = &e;
  if (!hit) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counters_.points_fired;
    log("troupe-fault: " + std::string(action_name(hit->action)) + " " + worker + " at " + point + " step " + std::to_string(step) +
        (hit->action != point_action::kill ? " for " + std::to_string(hit->duration.count()) + "ms" : ""));
  }
  if (hit->action == point_action::delay) {
    std::this_thread::sleep_for(hit->duration);  // the fault itself: this thread is late
    return;
  }
  if (hit->action == point_action::kill) {
    std::fflush(nullptr);
    ::kill(::getpid(), SIGKILL);
    ::pause();  // not reached
  }
  pause_self(hit->duration);
  std::lock_guard<std::mutex> lock(mutex_);
  log("troupe-fault: resumed " + worker + " at " + point + " step " + std::to_string(step));
}

bool fault_injector::may_silence() const {
  if (!plan_.silences.empty()) return true;
  return std::any_of(plan_.partitions.begin(), plan_.partitions.end(), [](const fault_partition& p) { return !p.hold; });
}

// Note [silent peers]: the cuts and heartbeat losses all begin at the injector's start.
std::optional<std::chrono::steady_clock::time_point> fault_injector::silent_since(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  auto live = [&](std::chrono::milliseconds d) { return now < healed_ && (d.count() == 0 || now < start_ + d); };
  for (const auto& p : plan_.partitions) {
    const bool across = (contains(p.side_a, from) && contains(p.side_b, to)) || (contains(p.side_b, from) && contains(p.side_a, to));
    if (!p.hold && across && live(p.duration)) return start_;
  }
  for (const auto& h : plan_.silences)
    if (contains(h.from, from) && contains(h.to, to) && live(h.duration)) return start_;
  return std::nullopt;
}

namespace {

constexpr std::string_view store_prefix = "troupe.store";  // Note [store faults] in store_client.cpp

bool is_store(const std::string& function) { return function.size() > store_prefix.size() && function.compare(0, store_prefix.size(), store_prefix) == 0 && function[store_prefix.size()] == '.'; }

// The first rule that matches a message of `kind` calling `function`. Rules match by "*", the
// kind's key or the function. A store message (Note [store faults]) also matches by
// "troupe.store" and by "troupe.store:KEY" with `store_key`, and not by the RPC kinds' keys.
const fault_rule* match_rule(const std::vector<fault_rule>& rules, message_kind kind, const std::string& function, std::string_view store_key) {
  const bool store = is_store(function);
  const char* kind_key = store || kind == message_kind::store_request || kind == message_kind::store_response ? "troupe.store"
                         : kind == message_kind::rpc_request ? "rpc_request" : kind == message_kind::rpc_response ? "rpc_response" : "actor_message";
  for (const auto& r : rules) {
    if (detail::is_collective_key(r.match)) continue;  // collective payloads only (match_collective)
    if (r.match == "*" || r.match == kind_key || (!function.empty() && r.match == function)) return &r;
    if (store && r.match.size() > store_prefix.size() + 1 && r.match.compare(0, store_prefix.size(), store_prefix) == 0 &&
        r.match[store_prefix.size()] == ':' && std::string_view(r.match).substr(store_prefix.size() + 1) == store_key)
      return &r;
  }
  return nullptr;
}

// The first collective rule that matches a collective payload (collective_faults.hpp); "*"
// and the other keys never match one.
const fault_rule* match_collective(const std::vector<fault_rule>& rules, const envelope& msg) {
  for (const auto& r : rules)
    if (detail::collective_key_matches(r.match, msg)) return &r;
  return nullptr;
}

}  // namespace

const fault_rule* fault_injector::rule_for(message_kind kind, const std::string& function) const {
  return match_rule(plan_.rules, kind, function, {});
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
  if (transport_decision cut; !plan_.partitions.empty() && partition_decision(msg, cut)) return cut;
  // Actor messages are faulted as requests (Note [remote actors]: drop, fail_first, duplicate,
  // delay, reorder), keyed by their kind.
  const bool request = msg.kind != message_kind::rpc_response && msg.kind != message_kind::store_response;
  const fault_rule* r = nullptr;
  std::string key;
  if (msg.kind == message_kind::collective_payload) {  // counted per rule (collective_faults.hpp)
    if (!(r = match_collective(plan_.rules, msg))) return {};
    key = "req:" + r->match;
  } else {
    // A response that names its function is a store answer (Note [store faults]).
    const std::string function = msg.kind != message_kind::rpc_response || !msg.function.empty() ? msg.function : function_of(msg, true);
    const bool store = is_store(function);
    r = match_rule(plan_.rules, msg.kind, function, store ? std::string_view(msg.payload.data(), msg.payload.size()) : std::string_view());
    if (!r) return {};
    // Actor messages count per type only under a rule for that type; a kind rule counts them
    // all. Store messages count per operation, or per key under a rule for the key.
    const bool by_function = !function.empty() && (msg.kind != message_kind::actor_message || r->match == function) &&
                             !(store && r->match.compare(0, store_prefix.size() + 1, "troupe.store:") == 0);
    key = (request ? "req:" : "rep:") + (by_function ? function : r->match);
  }
  const std::uint64_t n = sequence_[key]++;
  transport_decision d;
  if (request && n < static_cast<std::uint64_t>(r->fail_first)) d.copies = 0;
  if (request && r->nth > 0 && n + 1 == static_cast<std::uint64_t>(r->nth)) d.copies = 0;
  const double p_drop = request ? r->drop : r->drop_reply;
  if (p_drop > 0 && fault_random(plan_.seed, key, n, s_drop) < p_drop) d.copies = 0;
  std::string what = key + " #" + std::to_string(n) + " " + msg.from + "->" + msg.to;
  if (msg.kind == message_kind::collective_payload) what += " " + msg.function + " #" + std::to_string(msg.call_id);
  if (d.copies == 0) {
    ++(request ? counters_.dropped_requests : counters_.dropped_replies);
    log("troupe-fault: drop " + what);
    return d;
  }
  if (r->duplicate > 0 && fault_random(plan_.seed, key, n, s_duplicate) < r->duplicate) {
    d.copies = 2;
    ++counters_.duplicated;
    log("troupe-fault: duplicate " + what);
  }
  if (r->delay_max.count() > 0) d.delay = uniform_ms(fault_random(plan_.seed, key, n, s_delay), r->delay_min, r->delay_max);
  if (r->reorder.count() > 0)
    d.delay += uniform_ms(fault_random(plan_.seed, key, n, s_reorder), std::chrono::milliseconds(0), r->reorder);
  if (d.delay.count() > 0) {
    ++counters_.delayed;
    log("troupe-fault: delay " + what + " " + std::to_string(d.delay.count()) + "ms");
  }
  return d;
}

fault_counters fault_injector::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counters_;
}

}  // namespace troupe

namespace troupe {

void fault_point(node& n, const std::string& point, std::int64_t step) { n.fault_point(point, step); }

}  // namespace troupe
