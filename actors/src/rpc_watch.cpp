// The watch of slow calls and the callee's answer (Note [rpc blame] in rpc_watch.hpp).
#include "rpc_watch.hpp"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>

namespace troupe::detail {

namespace {

using clock = std::chrono::steady_clock;

std::string seconds(clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

// A recorded name or detail is cut to the recorder's limit: compare with the cut text.
bool same(const std::string& recorded, const std::string& full, std::size_t limit) { return recorded == full.substr(0, limit); }

}  // namespace

std::string where_is(const flight_recorder& rec, const std::string& me, const std::string& caller, const std::string& function) {
  const auto now = clock::now();
  const auto entries = rec.last();
  std::optional<clock::time_point> oldest_run, last_end;
  int runs = 0, others = 0;
  const trace_entry* oldest_other = nullptr;
  for (const auto& e : entries) {
    if (e.kind != trace_kind::rpc_serve) continue;
    const bool mine = same(e.name, function, flight_recorder::max_name) && same(e.detail, caller, flight_recorder::max_detail);
    if (e.ended) {
      if (mine) last_end = std::max(last_end.value_or(*e.ended), *e.ended);
      continue;
    }
    if (mine) {
      ++runs;
      oldest_run = std::min(oldest_run.value_or(e.started), e.started);
    } else if (e.name != blame_function) {
      ++others;
      if (!oldest_other || e.started < oldest_other->started) oldest_other = &e;
    }
  }
  std::string out = me;
  if (runs > 0) {
    out += " is running '" + function + "' for " + caller + " (" + (runs > 1 ? std::to_string(runs) + " runs, the oldest" : "started") + " " +
           seconds(now - *oldest_run) + " ago)";
  } else {
    out += " is not running '" + function + "' for " + caller;
    out += last_end ? "; its last run of it ended " + seconds(now - *last_end) + " ago"
                    : "; it has no record of it (never received, or still queued there)";
  }
  if (others == 0) return out + "; it runs no other call";
  return out + "; it runs " + std::to_string(others) + " other call" + (others > 1 ? "s" : "") + ", the oldest '" + oldest_other->name +
         "' for " + oldest_other->detail + " since " + seconds(now - oldest_other->started);
}

rpc_watch::rpc_watch(std::string me, std::shared_ptr<flight_recorder> rec, std::shared_ptr<rpc::detail::blame_board> board,
                     std::chrono::milliseconds blame_after, ask_fn ask, report_fn on_blame)
    : me_(std::move(me)),
      rec_(std::move(rec)),
      board_(board),
      blame_after_(blame_after),
      ask_(std::move(ask)),
      outlet_(std::make_shared<outlet>()) {
  outlet_->board = std::move(board);
  outlet_->on_blame = on_blame ? std::move(on_blame) : report_fn([](const std::string& s) { std::cerr << "troupe-blame: " << s << std::endl; });
  thread_ = std::thread([this] { run(); });
}

rpc_watch::~rpc_watch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  outlet_->close();  // an answer that comes later reports nothing
}

void rpc_watch::run() {
  const auto tick = std::clamp(blame_after_ / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(250));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, tick, [this] { return stop_; })) {
    lock.unlock();
    check();
    lock.lock();
  }
}

void rpc_watch::check() {
  const auto now = clock::now();
  std::set<std::uint64_t> still;  // the calls blamed before that still wait
  for (const auto& e : rec_->last()) {
    if (e.kind != trace_kind::rpc_call || e.ended || now - e.started < blame_after_ || e.name == blame_function) continue;
    if (blamed_.count(e.seq) == 0) blame(e, now - e.started);
    still.insert(e.seq);
  }
  blamed_ = std::move(still);  // a call that ended, or left the ring, is forgotten
}

void rpc_watch::blame(const trace_entry& e, clock::duration waited) {
  const std::string callee = e.detail;
  const std::string base = me_ + " called '" + e.name + "' on " + callee + " (call #" + std::to_string(e.seq) + ") and has waited " + seconds(waited);
  board_->put(e.seq, base + "; " + callee + " was asked where it is");
  const auto bound = ask_bound;
  std::shared_ptr<rpc::detail::call_state> q;
  try {
    q = ask_(callee, e.name, bound);
  } catch (const std::exception& ex) {
    outlet_->report(e.seq, base + "; " + callee + " cannot be asked: " + ex.what());
    return;
  }
  // Runs when the answer or the question's timeout comes, on an I/O thread; never blocks.
  rpc::future<std::string>(std::move(q)).then_inline([out = outlet_, base, callee, bound, seq = e.seq](const rpc::future<std::string>& f) {
    std::string text = base + "; ";
    try {
      text += f.get();
    } catch (const error& ex) {
      if (ex.code() == errc::timeout)
        text += callee + " did not answer within " + std::to_string(bound.count()) + " ms (busy, frozen or cut off)";
      else if (ex.code() == errc::peer_lost)
        text += callee + " is lost: " + ex.message();
      else
        text += callee + " cannot be asked: " + ex.message();
    }
    out->report(seq, text);
  });
}

void rpc_watch::outlet::report(std::uint64_t seq, const std::string& text) {
  std::lock_guard<std::mutex> lock(mu);
  if (closed) return;
  board->put(seq, text);
  on_blame(text);
}

void rpc_watch::outlet::close() {
  std::lock_guard<std::mutex> lock(mu);
  closed = true;
}

}  // namespace troupe::detail
