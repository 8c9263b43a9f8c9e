// Hang blame of one process group (Note [hang blame] in collective_watch.hpp).
#include "collective_watch.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

namespace troupe::ddp::detail {

namespace {

using clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// How long the watch reads the positions of the others, in all.
constexpr milliseconds read_budget{1500};

std::string encode(std::uint32_t seq, const std::string& op, const std::string& note) {
  return std::to_string(seq) + "\t" + op + "\t" + note;
}

milliseconds tick_of(milliseconds blame_after) {
  return std::clamp(blame_after / 4, milliseconds(10), milliseconds(250));
}

}  // namespace

collective_watch::collective_watch(watch_store store, std::string group, int rank, int world,
                                   std::shared_ptr<flight_recorder> recorder, milliseconds blame_after,
                                   std::function<void(const std::string&)> on_blame)
    : store_(std::move(store)),
      group_(std::move(group)),
      rank_(rank),
      world_(world),
      recorder_(std::move(recorder)),
      blame_after_(blame_after),
      on_blame_(std::move(on_blame)) {
  publish(position{});
  published_at_ = clock::now();
  if (blame_after_ > milliseconds(0)) thread_ = std::thread([this] { loop(); });
}

collective_watch::~collective_watch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

collective_watch::running collective_watch::enter(const std::string& op, std::uint32_t seq, const std::string& note,
                                                  const std::string& detail) {
  const std::uint64_t token = recorder_ ? recorder_->begin(trace_kind::collective, op, seq, note.empty() ? detail : note) : 0;
  std::lock_guard<std::mutex> lock(mu_);
  entered_.seq = seq;
  entered_.op = op;
  entered_.note = note;
  running_ = true;
  since_ = clock::now();
  return running(*this, token);
}

void collective_watch::leave(std::uint64_t token, bool ok) noexcept {
  if (recorder_) recorder_->end(token, ok);
  std::lock_guard<std::mutex> lock(mu_);
  running_ = false;
}

void collective_watch::loop() {
  const milliseconds tick = tick_of(blame_after_);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, tick, [&] { return stopping_; });
    if (stopping_) return;
    lock.unlock();
    try {
      watch_once(clock::now());
    } catch (...) {
      // The store is gone (shutdown, a dead store host): nothing to publish to; the
      // collective itself fails by its own timeout.
    }
    lock.lock();
  }
}

void collective_watch::watch_once(clock::time_point now) {
  position current;
  bool publish_now = false, blame_now = false;
  milliseconds waited{0};
  {
    std::lock_guard<std::mutex> lock(mu_);
    current = entered_;
    const bool changed = entered_.seq != published_;
    if (running_) waited = std::chrono::duration_cast<milliseconds>(now - since_);
    publish_now = changed && ((running_ && waited >= blame_after_ / 2) || now - published_at_ >= blame_after_ / 2);
    blame_now = running_ && waited >= blame_after_ && blamed_ != entered_.seq;
    if (publish_now) {
      published_ = entered_.seq;
      published_at_ = now;
    }
  }
  if (publish_now) publish(current);
  if (!blame_now) return;
  const std::string text = report(current, waited);
  {
    std::lock_guard<std::mutex> lock(mu_);
    blamed_ = current.seq;
  }
  const std::string line = "process_group '" + group_ + "' rank " + std::to_string(rank_) + ": " + current.op + " #" +
                           std::to_string(current.seq) + " waits: " + text;
  if (on_blame_) {
    on_blame_(line);
  } else {
    std::fprintf(stderr, "troupe: %s\n", line.c_str());
    std::fflush(stderr);
  }
}

void collective_watch::publish(const position& p) {
  store_.set("troupe/pg/" + group_ + "/at/" + std::to_string(rank_), encode(p.seq, p.op, p.note));
}

rank_position collective_watch::read_position(int r, clock::time_point until) {
  rank_position pos;
  pos.rank = r;
  const auto left = std::chrono::duration_cast<milliseconds>(until - clock::now());
  if (left <= milliseconds(0)) {
    pos.reachable = false;
    return pos;
  }
  try {
    const std::string v = store_.get("troupe/pg/" + group_ + "/at/" + std::to_string(r), std::min(left, milliseconds(500)));
    const auto tab1 = v.find('\t');
    const auto tab2 = tab1 == std::string::npos ? std::string::npos : v.find('\t', tab1 + 1);
    const std::uint64_t seq = std::stoull(v.substr(0, tab1));
    if (seq > 0) pos.entered = seq;
    if (tab2 != std::string::npos) {
      pos.detail = v.substr(tab1 + 1, tab2 - tab1 - 1);
      if (tab2 + 1 < v.size()) pos.detail += ", " + v.substr(tab2 + 1);
    }
  } catch (...) {
    pos.reachable = false;  // not published in time, or the store failed
  }
  return pos;
}

std::string collective_watch::report(const position& p, milliseconds waited) {
  std::lock_guard<std::mutex> lock(report_mu_);
  const auto until = clock::now() + read_budget;
  std::vector<rank_position> ranks;
  for (int r = 0; r < world_; ++r) {
    if (r != rank_) {
      ranks.push_back(read_position(r, until));
    } else {
      rank_position me;
      me.rank = r;
      me.entered = p.seq;
      ranks.push_back(me);
    }
  }
  return hang_report(p.op, p.seq, p.note, ranks, waited);
}

troupe::error collective_watch::explain(const troupe::error& e) {
  try {
    position current;
    milliseconds waited{0};
    {
      std::lock_guard<std::mutex> lock(mu_);
      current = entered_;
      waited = std::chrono::duration_cast<milliseconds>(clock::now() - since_);
      published_ = entered_.seq;
      published_at_ = clock::now();
    }
    try {
      publish(current);
    } catch (...) {
      // The store may be what failed; the report then says who did not answer.
    }
    const std::string text = report(current, waited);
    if (recorder_) recorder_->write_trace();
    return troupe::error(e.code(), e.message() + "; who is where: " + text);
  } catch (...) {
    return e;
  }
}

}  // namespace troupe::ddp::detail
