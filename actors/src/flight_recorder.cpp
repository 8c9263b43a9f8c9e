#include "troupe/actors/flight_recorder.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "troupe/tensors/error.hpp"

namespace troupe {

namespace {

using clock = std::chrono::steady_clock;
constexpr std::size_t name_words = flight_recorder::max_name / 8;
constexpr std::size_t detail_words = flight_recorder::max_detail / 8;
constexpr std::uint64_t token_bits = 16;

// Text is kept in relaxed atomic words. So a reader racing a writer reads stale bytes instead of
// racing on plain memory, and then discards them (Note [flight recorder]).
template <std::size_t N>
void store_text(std::array<std::atomic<std::uint64_t>, N>& words, std::string_view text) {
  char buf[N * 8] = {};
  if (!text.empty()) std::memcpy(buf, text.data(), std::min(text.size(), sizeof buf));  // data() may be null
  for (std::size_t i = 0; i < N; ++i) {
    std::uint64_t w;
    std::memcpy(&w, buf + i * 8, 8);
    words[i].store(w, std::memory_order_relaxed);
  }
}

template <std::size_t N>
std::string load_text(const std::array<std::atomic<std::uint64_t>, N>& words) {
  char buf[N * 8];
  for (std::size_t i = 0; i < N; ++i) {
    const std::uint64_t w = words[i].load(std::memory_order_relaxed);
    std::memcpy(buf + i * 8, &w, 8);
  }
  return std::string(buf, strnlen(buf, sizeof buf));
}

std::string json_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", static_cast<unsigned>(c));
      out += esc;
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

// version: 2 * token - 1 while begin writes the slot, 2 * token once written (token = n + 1).
// end_word: (end time in us << 17) | (token's low 16 bits << 1) | ok; 0 while the operation runs.
struct flight_recorder::slot {
  std::atomic<std::uint64_t> version{0};
  std::atomic<std::uint8_t> kind{0};
  std::atomic<std::uint64_t> seq{0};
  std::atomic<std::int64_t> start_us{0};
  std::atomic<std::uint64_t> end_word{0};
  std::array<std::atomic<std::uint64_t>, name_words> name{};
  std::array<std::atomic<std::uint64_t>, detail_words> detail{};
};

std::string_view to_string(trace_kind k) noexcept {
  switch (k) {
    case trace_kind::collective: return "collective";
    case trace_kind::rpc_call: return "rpc_call";
    case trace_kind::rpc_serve: return "rpc_serve";
    case trace_kind::backward: return "backward";
    case trace_kind::actor_message: return "actor_message";
    case trace_kind::step: return "step";
  }
  return "unknown";
}

flight_recorder::flight_recorder(std::size_t capacity, trace_target target)
    : capacity_(std::max<std::size_t>(capacity, 1)), slots_(new slot[capacity_]), origin_(clock::now()), target_(std::move(target)) {}

flight_recorder::~flight_recorder() = default;

std::uint64_t flight_recorder::begin(trace_kind kind, std::string_view name, std::uint64_t seq, std::string_view detail) noexcept {
  const std::uint64_t token = next_.fetch_add(1, std::memory_order_relaxed) + 1;
  slot& s = slots_[(token - 1) % capacity_];
  // Claim the slot: only the claimant writes its fields. A slot may still be written by an older
  // writer that stalled for a whole turn of the ring. Or a newer token may have taken it. Such
  // a slot is left alone, and this operation goes unrecorded.
  std::uint64_t v = s.version.load(std::memory_order_acquire);
  do {
    if ((v & 1) != 0 || v >= 2 * token) return token;
  } while (!s.version.compare_exchange_weak(v, 2 * token - 1, std::memory_order_acquire, std::memory_order_relaxed));
  std::atomic_thread_fence(std::memory_order_release);
  s.kind.store(static_cast<std::uint8_t>(kind), std::memory_order_relaxed);
  s.seq.store(seq, std::memory_order_relaxed);
  s.start_us.store(std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - origin_).count(), std::memory_order_relaxed);
  s.end_word.store(0, std::memory_order_relaxed);
  store_text(s.name, name);
  store_text(s.detail, detail);
  s.version.store(2 * token, std::memory_order_release);
  return token;
}

void flight_recorder::end(std::uint64_t token, bool ok) noexcept {
  if (token == 0) return;
  slot& s = slots_[(token - 1) % capacity_];
  if (s.version.load(std::memory_order_acquire) != 2 * token) return;  // reused since
  const auto us = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - origin_).count());
  const std::uint64_t low = token & ((std::uint64_t{1} << token_bits) - 1);
  s.end_word.store((us << (token_bits + 1)) | (low << 1) | (ok ? 1 : 0), std::memory_order_release);
}

std::vector<trace_entry> flight_recorder::last(std::size_t n) const {
  const std::uint64_t issued = next_.load(std::memory_order_acquire);
  const std::uint64_t kept = std::min<std::uint64_t>(issued, capacity_);
  const std::uint64_t want = n == 0 ? kept : std::min<std::uint64_t>(n, kept);
  std::vector<trace_entry> out;
  out.reserve(want);
  for (std::uint64_t token = issued - want + 1; token <= issued; ++token) {
    const slot& s = slots_[(token - 1) % capacity_];
    if (s.version.load(std::memory_order_acquire) != 2 * token) continue;  // being written or reused
    trace_entry e;
    e.kind = static_cast<trace_kind>(s.kind.load(std::memory_order_relaxed));
    e.seq = s.seq.load(std::memory_order_relaxed);
    e.started = origin_ + std::chrono::microseconds(s.start_us.load(std::memory_order_relaxed));
    e.name = load_text(s.name);
    e.detail = load_text(s.detail);
    const std::uint64_t w = s.end_word.load(std::memory_order_acquire);
    const std::uint64_t low = token & ((std::uint64_t{1} << token_bits) - 1);
    if (w != 0 && ((w >> 1) & ((std::uint64_t{1} << token_bits) - 1)) == low) {
      e.ended = origin_ + std::chrono::microseconds(static_cast<std::int64_t>(w >> (token_bits + 1)));
      e.ok = (w & 1) != 0;
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.version.load(std::memory_order_relaxed) != 2 * token) continue;  // rewritten while read
    out.push_back(std::move(e));
  }
  return out;
}

std::optional<std::uint64_t> flight_recorder::highest_seq(trace_kind kind, std::string_view name) const {
  std::optional<std::uint64_t> best;
  for (const auto& e : last())
    if (e.kind == kind && e.name == name && (!best || e.seq > *best)) best = e.seq;
  return best;
}

std::string flight_recorder::chrome_trace(int pid, std::string_view process_name) const {
  std::ostringstream os;
  os << "{\"traceEvents\":[";
  os << "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" << pid << ",\"tid\":0,\"args\":{\"name\":\"" << json_escape(process_name)
     << "\"}}";
  for (int k = 0; k <= static_cast<int>(trace_kind::step); ++k)
    os << ",{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << pid << ",\"tid\":" << k << ",\"args\":{\"name\":\""
       << to_string(static_cast<trace_kind>(k)) << "\"}}";
  const auto now = clock::now();
  for (const auto& e : last()) {
    const auto ts = std::chrono::duration_cast<std::chrono::microseconds>(e.started - origin_).count();
    const auto dur = std::chrono::duration_cast<std::chrono::microseconds>(e.ended.value_or(now) - e.started).count();
    os << ",{\"ph\":\"X\",\"pid\":" << pid << ",\"tid\":" << static_cast<int>(e.kind) << ",\"ts\":" << ts << ",\"dur\":" << dur
       << ",\"cat\":\"" << to_string(e.kind) << "\",\"name\":\"" << json_escape(e.name) << " #" << e.seq << "\",\"args\":{\"detail\":\""
       << json_escape(e.detail) << "\",\"ok\":" << (e.ok ? "true" : "false") << ",\"running\":" << (e.ended ? "false" : "true") << "}}";
  }
  os << "]}";
  return os.str();
}

void flight_recorder::write_chrome_trace(const std::string& dir, int pid, std::string_view process_name) const {
  const std::string path = dir + "/trace-rank" + std::to_string(pid) + ".json";
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) throw error(errc::io_error, "flight recorder: cannot write the trace file " + tmp);
    f << chrome_trace(pid, process_name);
    f.flush();
    if (!f) throw error(errc::io_error, "flight recorder: writing the trace file " + tmp + " failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw error(errc::io_error, "flight recorder: cannot rename " + tmp + " to " + path);
  }
}

bool flight_recorder::write_trace() const noexcept {
  if (target_.dir.empty()) return false;
  try {
    write_chrome_trace(target_.dir, target_.pid, target_.process_name);
    return true;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe: %s\n", e.what());
  } catch (...) {
  }
  return false;
}

std::string rank_ranges(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string hang_report(std::string_view op, std::uint64_t seq, std::string_view detail, const std::vector<rank_position>& ranks,
                        std::chrono::milliseconds waited) {
  std::vector<int> in, unreachable;
  std::vector<std::string> missing;
  for (const auto& r : ranks) {
    if (!r.reachable) {
      unreachable.push_back(r.rank);
    } else if (r.entered && *r.entered >= seq) {
      in.push_back(r.rank);
    } else {
      std::string m = "rank " + std::to_string(r.rank) + " never entered " + std::string(op) + " #" + std::to_string(seq);
      if (!detail.empty()) m += " (" + std::string(detail) + ")";
      m += r.entered ? "; its last was #" + std::to_string(*r.entered) + (r.detail.empty() ? "" : " (" + r.detail + ")") : "; it entered none";
      missing.push_back(std::move(m));
    }
  }
  std::string out;
  for (const auto& m : missing) out += (out.empty() ? "" : "; ") + m;
  if (!unreachable.empty())
    out += (out.empty() ? "" : "; ") + std::string(unreachable.size() == 1 ? "rank " : "ranks ") + rank_ranges(unreachable) +
           " did not answer (dead or frozen)";
  if (!in.empty()) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f", std::chrono::duration<double>(waited).count());
    out += (out.empty() ? "" : "; ") + std::string(in.size() == 1 ? "rank " : "ranks ") + rank_ranges(in) + " waited " + secs + " s";
  }
  if (missing.empty() && unreachable.empty())
    out = "every rank entered " + std::string(op) + " #" + std::to_string(seq) + "; " + out;
  return out;
}

}  // namespace troupe
