// Shared-memory tensors across processes with both strategies (file_descriptor over SCM_RIGHTS,
// file_system with the manager process), and no segment left behind, even after a SIGKILL.

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/actors/shared_memory.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;

namespace {

// A contiguous float32 CPU tensor holding `values` (built on a raw storage).
troupe::tensor float_tensor(const std::vector<float>& values) {
  auto impl = std::make_shared<troupe::tensor_impl>();
  impl->storage = troupe::storage::make(values.size() * sizeof(float), troupe::cpu_allocator());
  std::memcpy(impl->storage->data(), values.data(), values.size() * sizeof(float));
  impl->sizes = {static_cast<std::int64_t>(values.size())};
  impl->strides = {1};
  impl->dtype = troupe::dtype::float32;
  return troupe::tensor(std::move(impl));
}

std::vector<float> iota_values(std::size_t n, float start) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

// Throws (in a child: the message reaches the parent's join) unless t holds start, start+1, ...
void expect_iota(const troupe::tensor& t, float start, const char* where) {
  const float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (p[i] != start + static_cast<float>(i))
      throw std::runtime_error(std::string(where) + ": element " + std::to_string(i) + " is " + std::to_string(p[i]) +
                               ", expected " + std::to_string(start + static_cast<float>(i)));
}

void fill_iota(const troupe::tensor& t, float start) {
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = start + static_cast<float>(i);
}

// A job name unique to this test process, so parallel test runs never see each other's segments.
std::string job_name(const char* test) { return std::string(test) + "-" + std::to_string(::getpid()); }

// The segments of `job` that exist in /dev/shm.
std::vector<std::string> segments_of(const std::string& job) {
  const std::string prefix = troupe::shm_name_prefix(job).substr(1);
  std::vector<std::string> out;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0) out.emplace_back(e->d_name);
    ::closedir(d);
  }
  return out;
}

}  // namespace

TEST_CASE("share_memory_ moves a storage into a memfd segment and every view follows", "[actors][integration]") {
  troupe::shm_provider provider("views");
  troupe::tensor t = float_tensor(iota_values(8, 0));
  troupe::tensor odd = troupe::make_view(t, {4}, {2}, 1);  // elements 1, 3, 5, 7
  const void* before = t.data_ptr();
  CHECK_FALSE(troupe::is_shared(t));
  troupe::share_memory_(t, provider);
  CHECK(troupe::is_shared(t));
  CHECK(troupe::is_shared(odd));
  CHECK(t.data_ptr() != before);
  expect_iota(t, 0, "after share");
  odd.data<float>()[2 * odd.stride(0)] = 50;  // odd[2], element 5 of t
  CHECK(t.data<float>()[5] == 50);
  const troupe::shm_handle h = troupe::shared_handle_of(t);
  CHECK(h.strategy == troupe::sharing_strategy::file_descriptor);
  CHECK(h.fd >= 0);
  CHECK(h.nbytes == 8 * sizeof(float));
  troupe::share_memory_(t, provider);  // already shared: no-op
  CHECK(troupe::shared_handle_of(t).fd == h.fd);
}

TEST_CASE("a file_descriptor tensor crosses to a child over SCM_RIGHTS and writes are seen both ways",
          "[actors][integration]") {
  troupe::shm_provider provider("fdxproc");
  // Named references, not a structured binding: clang 14 cannot capture one in a lambda.
  auto channels = troupe::shm_channel::make_pair();
  auto& mine = channels.first;
  auto& theirs = channels.second;
  troupe::tensor t = float_tensor(iota_values(1024, 0));
  troupe::share_memory_(t, provider);
  auto ctx = troupe::spawn(1, [&](int) {
    mine.close();
    troupe::tensor got = theirs.recv(30s);
    expect_iota(got, 0, "child sees the parent's data");
    fill_iota(got, 1000);  // the parent checks this after join
    // The child's own tensor, for the parent to write into.
    troupe::shm_provider child_provider("fdxproc-child");
    troupe::tensor own = float_tensor(iota_values(16, 0));
    troupe::share_memory_(own, child_provider);
    theirs.send(own, 30s);
    (void)theirs.recv(30s);  // the parent sends it back after writing
    expect_iota(own, 500, "child sees the parent's write");
  });
  theirs.close();
  mine.send(t);
  troupe::tensor child_tensor = mine.recv(30s);
  expect_iota(child_tensor, 0, "parent sees the child's data");
  fill_iota(child_tensor, 500);
  mine.send(child_tensor);
  REQUIRE(ctx.join(30s));
  expect_iota(t, 1000, "parent sees the child's write");
}

TEST_CASE("a file_system tensor crosses to a child by name and writes are seen both ways", "[actors][integration]") {
  const std::string job = job_name("fsxproc");
  {
    auto manager = troupe::shm_manager::start(job);
    auto client = troupe::shm_manager_client::connect(manager.address(), job);
    troupe::shm_provider provider(troupe::sharing_strategy::file_system, job, client);
    // Named references, not a structured binding: clang 14 cannot capture one in a lambda.
    auto channels = troupe::shm_channel::make_pair();
    auto& mine = channels.first;
    auto& theirs = channels.second;
    troupe::tensor t = float_tensor(iota_values(4096, 0));
    troupe::share_memory_(t, provider);
    CHECK(troupe::shared_handle_of(t).strategy == troupe::sharing_strategy::file_system);
    CHECK(segments_of(job).size() == 1);
    const std::string address = manager.address();
    auto ctx = troupe::spawn(1, [&](int) {
      mine.close();
      troupe::tensor got = theirs.recv(30s);
      expect_iota(got, 0, "child sees the parent's data");
      fill_iota(got, 7);
      auto child_client = troupe::shm_manager_client::connect(address, job);
      troupe::shm_provider child_provider(troupe::sharing_strategy::file_system, job, child_client);
      troupe::tensor own = float_tensor(iota_values(32, 0));
      troupe::share_memory_(own, child_provider);
      theirs.send(own, 30s);
      (void)theirs.recv(30s);
      expect_iota(own, -3, "child sees the parent's write");
    });
    theirs.close();
    mine.send(t);
    {
      troupe::tensor child_tensor = mine.recv(30s);
      expect_iota(child_tensor, 0, "parent sees the child's data");
      fill_iota(child_tensor, -3);
      mine.send(child_tensor);
    }
    REQUIRE(ctx.join(30s));
    expect_iota(t, 7, "parent sees the child's write");
    CHECK(segments_of(job).size() == 1);  // the child unlinked its own segment on exit
  }
  CHECK(segments_of(job).empty());
}

TEST_CASE("the manager unlinks the segment of a child killed by SIGKILL", "[actors][integration]") {
  const std::string job = job_name("fskill");
  auto manager = troupe::shm_manager::start(job);
  auto client = troupe::shm_manager_client::connect(manager.address(), job);
  // Named references, not a structured binding: clang 14 cannot capture one in a lambda.
  auto channels = troupe::shm_channel::make_pair();
  auto& mine = channels.first;
  auto& theirs = channels.second;
  const std::string address = manager.address();
  auto ctx = troupe::spawn(1, [&](int) {
    auto child_client = troupe::shm_manager_client::connect(address, job);
    troupe::shm_provider child_provider(troupe::sharing_strategy::file_system, job, child_client);
    troupe::tensor own = float_tensor(iota_values(1 << 16, 0));
    troupe::share_memory_(own, child_provider);
    theirs.send(own, 30s);
    ::pause();  // until killed (the test kills it)
  });
  {
    troupe::tensor got = mine.recv(30s);
    expect_iota(got, 0, "parent sees the child's data");
    CHECK(segments_of(job).size() == 1);
    ctx.kill(0, SIGKILL);
    CHECK_THROWS_WITH(ctx.join(30s), Catch::Contains("SIGKILL"));
    client->sync();  // the manager has handled the child's death
    CHECK(segments_of(job).empty());
    expect_iota(got, 0, "the parent's mapping outlives the unlinked name");
  }
  manager.stop();
  CHECK(manager.pid() == -1);
}

TEST_CASE("stopping the manager unlinks every segment still registered", "[actors][integration]") {
  const std::string job = job_name("fsstop");
  auto manager = troupe::shm_manager::start(job);
  auto client = troupe::shm_manager_client::connect(manager.address(), job);
  const std::string name = troupe::shm_name_prefix(job) + "leaked";
  client->register_segment(name);
  troupe::shm_segment seg = troupe::shm_segment::create_named(4096, name);
  CHECK(segments_of(job).size() == 1);
  manager.stop();
  CHECK(segments_of(job).empty());
}

TEST_CASE("the manager refuses a name outside the job's prefix", "[actors][integration]") {
  const std::string job = job_name("fsrefuse");
  auto manager = troupe::shm_manager::start(job);
  auto client = troupe::shm_manager_client::connect(manager.address(), job);
  CHECK_THROWS_WITH(client->register_segment("/someone_else"), Catch::Contains("refused"));
  CHECK_THROWS_AS(troupe::shm_name_prefix("bad/job"), troupe::error);
}

TEST_CASE("shared-memory errors name the segment and the failing call", "[actors][integration]") {
  try {
    (void)troupe::shm_segment::open_named("/troupe_nosuchjob_segment", 64);
    FAIL("open_named of a missing segment did not throw");
  } catch (const troupe::error& e) {
    CHECK(e.code() == troupe::errc::io_error);
    CHECK_THAT(e.message(), Catch::Contains("/troupe_nosuchjob_segment") && Catch::Contains("shm_open"));
  }
  troupe::shm_provider provider("errors");
  troupe::tensor plain = float_tensor({1, 2, 3});
  auto [a, b] = troupe::shm_channel::make_pair();
  CHECK_THROWS_WITH(a.send(plain), Catch::Contains("not in shared memory"));
  CHECK_THROWS_AS(b.recv(20ms), troupe::error);
  troupe::share_memory_(plain, provider);
  CHECK_THROWS_WITH(troupe::tensor_from_shared_handle(troupe::shared_handle_of(plain), troupe::dtype::float32, {4},
                                                      {1}, 0),
                    Catch::Contains("needs 16 bytes"));
  a.close();
  CHECK_THROWS_WITH(b.recv(1s), Catch::Contains("closed"));
}
