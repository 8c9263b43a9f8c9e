#pragma once
/// \file flight_recorder.hpp
/// The last operations of one rank (collectives, RPCs, backward passes), always on, and what
/// they tell when a job waits: who is where.
///
/// Note [flight recorder]
///
/// A recorder is a ring of `capacity` slots. `begin` takes the next slot with one atomic add.
/// It claims the slot with a compare-and-swap of its version and writes the operation there.
/// `end` stamps the same slot when the operation finishes, unless the slot was reused
/// meanwhile. Writers never block and never allocate. A writer that finds its slot still being
/// written by one a whole turn of the ring older leaves the operation unrecorded.
/// Readers (`last`, `chrome_trace`) copy slots under a per-slot sequence check, so a slot written
/// while it is read is skipped, never torn.
///
///   begin(kind, name, seq) --claim slot i = n++ % capacity--> {gen, kind, name, seq, t0}
///   end(token)             --if slot i still has token's gen--> {t1, ok}
///
/// Guarantees: a snapshot holds at most `capacity` operations, in the order they began; each
/// has its name cut to `max_name` bytes. Costs: a few atomic operations and a steady_clock read per
/// begin and per end. Contract for blame (hang_report): every rank numbers the operations of
/// one group the same way, by the collective sequence number. So comparing the highest number
/// each rank entered shows which rank is missing.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

/// What kind of operation a trace entry is.
enum class trace_kind : std::uint8_t { collective = 0, rpc_call = 1, rpc_serve = 2, backward = 3, actor_message = 4, step = 5 };

/// The name of a trace kind ("collective", "rpc_call", ...).
std::string_view to_string(trace_kind k) noexcept;

/// One recorded operation, as a snapshot returns it.
struct trace_entry {
  trace_kind kind = trace_kind::collective;
  std::string name;      ///< e.g. "allreduce", or the RPC function
  std::string detail;    ///< e.g. "bucket 2", or the peer
  std::uint64_t seq = 0;  ///< the group's sequence number, or the call id
  std::chrono::steady_clock::time_point started;
  std::optional<std::chrono::steady_clock::time_point> ended;  ///< empty while it runs
  bool ok = true;  ///< false when it ended in an error
};

/// Where a recorder writes its Chrome trace: `dir`/trace-rank<pid>.json. An empty `dir`: nowhere.
struct trace_target {
  std::string dir;
  int pid = 0;                ///< the rank
  std::string process_name;   ///< its label in the trace, e.g. the worker name
};

/// A rank's ring of its last operations (see the note). Thread-safe; writers never block.
class flight_recorder {
 public:
  static constexpr std::size_t max_name = 40;
  static constexpr std::size_t max_detail = 40;

  /// A recorder of the last `capacity` operations (at least 1) that writes its trace to `target`.
  explicit flight_recorder(std::size_t capacity = 512, trace_target target = {});
  ~flight_recorder();
  flight_recorder(const flight_recorder&) = delete;
  flight_recorder& operator=(const flight_recorder&) = delete;

  /// Records the start of an operation; returns the token that `end` takes. Never blocks.
  std::uint64_t begin(trace_kind kind, std::string_view name, std::uint64_t seq, std::string_view detail = {}) noexcept;
  /// Records the end of the operation `token` began; a no-op when its slot was reused since.
  void end(std::uint64_t token, bool ok = true) noexcept;

  /// The last `n` operations (all kept ones when n is 0), oldest first.
  std::vector<trace_entry> last(std::size_t n = 0) const;
  /// The highest sequence number of a `kind` operation named `name` that began, if any was kept.
  std::optional<std::uint64_t> highest_seq(trace_kind kind, std::string_view name) const;
  /// The kept operations as a Chrome trace ("traceEvents" JSON) that Perfetto opens; `pid` is
  /// the rank and `process_name` its label.
  std::string chrome_trace(int pid, std::string_view process_name) const;
  /// Writes chrome_trace() to `dir`/trace-rank<pid>.json (through a temporary file and a rename,
  /// so a reader never sees half a file). Throws io_error naming the path.
  void write_chrome_trace(const std::string& dir, int pid, std::string_view process_name) const;
  /// Writes the trace to the target given at construction; does nothing without one. Never
  /// throws: a failure is printed on stderr. Returns whether a file was written.
  bool write_trace() const noexcept;

  std::size_t capacity() const noexcept { return capacity_; }
  const trace_target& target() const noexcept { return target_; }

 private:
  struct slot;
  std::size_t capacity_;
  std::unique_ptr<slot[]> slots_;
  std::atomic<std::uint64_t> next_{0};
  std::chrono::steady_clock::time_point origin_;
  trace_target target_;
};

/// RAII: begins an operation on construction and ends it on destruction (ok unless `fail()`).
class trace_scope {
 public:
  trace_scope(flight_recorder* rec, trace_kind kind, std::string_view name, std::uint64_t seq, std::string_view detail = {}) noexcept
      : rec_(rec), token_(rec ? rec->begin(kind, name, seq, detail) : 0) {}
  ~trace_scope() {
    if (rec_) rec_->end(token_, ok_);
  }
  trace_scope(const trace_scope&) = delete;
  trace_scope& operator=(const trace_scope&) = delete;
  /// Marks the operation as failed.
  void fail() noexcept { ok_ = false; }

 private:
  flight_recorder* rec_;
  std::uint64_t token_;
  bool ok_ = true;
};

/// Where one rank stands in a group's sequence of operations, for hang_report.
struct rank_position {
  int rank = 0;
  std::optional<std::uint64_t> entered;  ///< highest sequence number it began; empty: none
  std::string detail;                    ///< what that operation was, e.g. "bucket 2"
  bool reachable = true;                 ///< false: the rank did not answer (dead or frozen)
};

/// Who is where when operation `seq` (named `op`, e.g. "allreduce") waits: the ranks that never
/// entered it and how long the others waited. Example: "rank 3 never entered allreduce #118
/// (bucket 2); ranks 0-2 waited 2.0 s". `detail` names the waited operation. Pure function.
std::string hang_report(std::string_view op, std::uint64_t seq, std::string_view detail, const std::vector<rank_position>& ranks,
                        std::chrono::milliseconds waited);

/// "0-2,5": sorted ranks as ranges.
std::string rank_ranges(std::vector<int> ranks);

}  // namespace troupe
