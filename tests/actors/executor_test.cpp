// The executor's leader/follower policy (actors/src/executor.hpp): quick jobs run on the leader,
// before the ordinary job it read with them.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "executor.hpp"

using namespace std::chrono_literals;

namespace {

// Hands out one prepared read, then waits (bounded) until interrupted.
class scripted_source : public troupe::detail::io_source {
 public:
  explicit scripted_source(troupe::detail::led_jobs first) : first_(std::move(first)) {}
  void lead(troupe::detail::led_jobs& got) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!given_) {
      given_ = true;
      reader_ = std::this_thread::get_id();
      got = std::move(first_);
      return;
    }
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
  CHECK(r.j.runs[0].first == "fetch");
  CHECK(r.j.runs[1].first == "delete");
  CHECK(r.j.runs[2].first == "user call");
  for (int i = 0; i < 3; ++i) CHECK(r.j.runs[static_cast<std::size_t>(i)].second == r.reader);
  CHECK(r.j.runs[3].first == "queued call");  // a follower's
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
