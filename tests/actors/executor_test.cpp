// The executor's leader/follower policy (actors/src/executor.hpp): quick jobs run on the leader,
// before the ordinary job it read with them.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "executor.hpp"

using namespace std::chrono_literals;

namespace {

// Hands out one prepared read, then waits (bounded) until interrupted. `settle`: how long the
// first lead() waits before handing it out (threads woken by set_source go back to sleep);
// `on_other_lead`: called whenever a thread other than the first reader leads.
class scripted_source : public troupe::detail::io_source {
 public:
  explicit scripted_source(troupe::detail::led_jobs first, std::chrono::milliseconds settle = 0ms,
                           std::function<void()> on_other_lead = {})
      : first_(std::move(first)), settle_(settle), on_other_lead_(std::move(on_other_lead)) {}
  void lead(troupe::detail::led_jobs& got) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!given_) {
      given_ = true;
      reader_ = std::this_thread::get_id();
      if (settle_.count() > 0) cv_.wait_for(lock, settle_, [] { return false; });
      got = std::move(first_);
      return;
    }
    if (on_other_lead_ && std::this_thread::get_id() != reader_) on_other_lead_();
    cv_.wait_for(lock, 20ms, [this] { return interrupted_; });
    interrupted_ = false;
  }
  void interrupt() override {
    std::lock_guard<std::mutex> lock(mutex_);
    interrupted_ = true;
    cv_.notify_all();
  }
  std::thread::id reader() {
    std::lock_guard<std::mutex> lock(mutex_);
    return reader_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  troupe::detail::led_jobs first_;
  std::chrono::milliseconds settle_;
  std::function<void()> on_other_lead_;
  bool given_ = false, interrupted_ = false;
  std::thread::id reader_;
};

// What ran, in order, and on which thread.
struct journal {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<std::pair<std::string, std::thread::id>> runs;
  std::function<void()> entry(std::string name) {
    return [this, name] {
      std::lock_guard<std::mutex> lock(mutex);
      runs.emplace_back(name, std::this_thread::get_id());
      cv.notify_all();
    };
  }
  bool wait_for(std::size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    return cv.wait_for(lock, 5s, [&] { return runs.size() >= n; });
  }
};

}  // namespace

// Runs an executor of `threads` on a source that hands out `read` once, until `n` jobs ran.
struct one_read {
  journal j;
  std::thread::id reader;
  bool ran = false;
  one_read(const std::function<troupe::detail::led_jobs(journal&)>& make, int threads, std::size_t n) {
    scripted_source src(make(j));
    troupe::detail::executor ex(threads);
    ex.set_source(&src);
    ran = j.wait_for(n);
    ex.set_source(nullptr);
    ex.stop();
    reader = src.reader();
  }
};

TEST_CASE("the leader runs the quick jobs it read first, then its ordinary job, on its own thread", "[executor]") {
  one_read r([](journal& j) {
    troupe::detail::led_jobs read;
    read.quick.push_back(j.entry("fetch"));
    read.quick.push_back(j.entry("delete"));
    read.jobs.push_back(j.entry("user call"));
    read.jobs.push_back(j.entry("queued call"));
    return read;
  }, 3, 4);
  REQUIRE(r.ran);
  REQUIRE(r.j.runs.size() == 4);
  // The reading thread ran, in this order: the quick jobs, then the first ordinary job. The queued
  // one is left to any thread (a woken follower at any moment, or the reader once it is free).
  std::vector<std::string> on_reader;
  for (const auto& [name, thread] : r.j.runs)
    if (thread == r.reader && name != "queued call") on_reader.push_back(name);
  CHECK(on_reader == std::vector<std::string>{"fetch", "delete", "user call"});
  CHECK(std::count_if(r.j.runs.begin(), r.j.runs.end(), [](const auto& e) { return e.first == "queued call"; }) == 1);
}

TEST_CASE("a read of quick jobs only runs them on the thread that read them", "[executor]") {
  one_read r([](journal& j) {
    troupe::detail::led_jobs read;
    read.quick.push_back(j.entry("ack"));
    return read;
  }, 2, 1);
  REQUIRE(r.ran);
  CHECK(r.j.runs[0].second == r.reader);
}

namespace {

// Runs one read holding one quick job that calls `first` and then blocks until another thread
// leads (at most `give_up`). Returns how long that took, or nothing when nobody else led. The other
// thread, woken by set_source, is back asleep when the quick job runs: it leads only if something
// wakes it.
std::optional<std::chrono::milliseconds> other_leads_while_quick_job_blocks(std::function<void(const troupe::detail::executor&)> first,
                                                                            std::chrono::microseconds watchdog_tick,
                                                                            std::chrono::milliseconds give_up = 5s) {
  std::mutex m;
  std::condition_variable cv;
  bool other_led = false, done = false, saw = false;
  std::chrono::steady_clock::time_point began;
  std::chrono::milliseconds took{};
  const troupe::detail::executor* running = nullptr;  // set before the source is attached
  troupe::detail::led_jobs read;
  read.quick.push_back([&] {
    began = std::chrono::steady_clock::now();
    first(*running);
    std::unique_lock<std::mutex> lock(m);
    saw = cv.wait_for(lock, give_up, [&] { return other_led; });  // still inside the quick job
    took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - began);
    done = true;
  });
  scripted_source src(std::move(read), 100ms, [&] {
    std::lock_guard<std::mutex> lock(m);
    other_led = true;
    cv.notify_all();
  });
  troupe::detail::executor ex(2, watchdog_tick);
  running = &ex;
  ex.set_source(&src);
  const auto until = std::chrono::steady_clock::now() + 10s;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(m);
      if (done || std::chrono::steady_clock::now() > until) break;
    }
    std::this_thread::sleep_for(1ms);
  }
  ex.set_source(nullptr);
  ex.stop();
  std::lock_guard<std::mutex> lock(m);
  if (!saw) return std::nullopt;
  return took;
}

}  // namespace

TEST_CASE("a quick job that announces long work hands the lead to a follower while it runs", "[executor]") {
  // The watchdog never ticks here: only long_work_ahead() can wake the other thread.
  const auto took = other_leads_while_quick_job_blocks([](const troupe::detail::executor& ex) { ex.long_work_ahead(); }, 3600s);
  REQUIRE(took.has_value());
  CHECK(*took < 1000ms);
}

TEST_CASE("a notice of long work from a thread that does not lead hands nothing off", "[executor]") {
  // Only the leading thread itself may hand its quick phase off: the notice names no thread.
  const auto took = other_leads_while_quick_job_blocks([](const troupe::detail::executor& ex) {
    std::thread other([&ex] { ex.long_work_ahead(); });
    other.join();
  }, 3600s, 300ms);
  CHECK_FALSE(took.has_value());
}

TEST_CASE("a notice of long work to another executor hands nothing off", "[executor]") {
  troupe::detail::executor elsewhere(1, 3600s);
  const auto took = other_leads_while_quick_job_blocks([&elsewhere](const troupe::detail::executor&) { elsewhere.long_work_ahead(); },
                                                       3600s, 300ms);
  CHECK_FALSE(took.has_value());
}

TEST_CASE("without the watchdog, a quick job that blocks without a word leaves the lead unfilled", "[executor]") {
  // The control for the next test: nothing else wakes the follower (so that one measures the watchdog).
  CHECK_FALSE(other_leads_while_quick_job_blocks([](const troupe::detail::executor&) {}, 3600s, 300ms).has_value());
}

TEST_CASE("the watchdog hands the lead on when a quick job blocks without a word", "[executor]") {
  // Note [predicted quick]: a function predicted short that blocks this time (its own lock, a
  // sleep) is noticed at the second tick that finds its quick phase still running.
  const auto took = other_leads_while_quick_job_blocks([](const troupe::detail::executor&) {}, troupe::detail::executor::default_watchdog_tick);
  REQUIRE(took.has_value());
  CHECK(*took < 500ms);  // two 1 ms ticks; the bound is for a loaded CI machine
}
