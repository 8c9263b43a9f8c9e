// Multi-process tests of the everyday RPC surface: chained then(), collect_all, the worker list
// and get_worker_info.
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/actors/workers.hpp"

using namespace std::chrono_literals;
using troupe::errc;

namespace {

void serve(std::uint16_t port) {
  troupe::node_options o = troupe::test::test_options(1, 2, port);
  o.name = "trainer";
  troupe::node n(o);
  n.functions().add("add", [](int a, int b) { return a + b; });
  n.functions().add("fail", [](int) -> int { throw std::runtime_error("no such thing"); });
  troupe::test::serve_until_done(n);
}

template <class F>
errc code_of(F&& f) {
  try {
    f();
  } catch (const troupe::error& e) {
    return e.code();
  }
  return errc::ok;
}

}  // namespace

TEST_CASE("then returns a future that chains, carries the continuation's value and propagates errors", "[actors][rpc]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { serve(pipe.read()); });
  troupe::node n(troupe::test::test_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  n.store().wait({"ready"}, 10s);

  auto chained = troupe::rpc_async<int>(n, "trainer", "add", 20, 1)
                     .then([](troupe::rpc::future<int> f) { return f.get() * 2; })
                     .then([](troupe::rpc::future<int> f) { return std::to_string(f.get()) + "!"; });
  CHECK(chained.get() == "42!");
  CHECK(chained.get() == "42!");  // a copyable value: every get() returns it

  troupe::rpc::future<void> done = troupe::rpc_async<int>(n, "trainer", "add", 1, 1).then([](troupe::rpc::future<int> f) { (void)f.get(); });
  REQUIRE(done.wait(10s));
  CHECK_NOTHROW(done.get());

  // The call's error reaches the end of the chain through get() in each continuation.
  auto failed = troupe::rpc_async<int>(n, "trainer", "fail", 0)
                    .then([](troupe::rpc::future<int> f) { return f.get() + 1; })
                    .then([](troupe::rpc::future<int> f) { return f.get() + 1; });
  CHECK(code_of([&] { failed.get(); }) == errc::remote_exception);

  // A continuation that throws: a troupe::error keeps its code, another exception becomes
  // remote_exception with its text; a continuation may also recover from the call's error.
  auto threw = troupe::rpc_async<int>(n, "trainer", "add", 1, 2).then([](troupe::rpc::future<int>) -> int {
    throw troupe::error(errc::bad_argument, "rejected by the continuation");
  });
  CHECK(code_of([&] { threw.get(); }) == errc::bad_argument);
  auto std_threw = troupe::rpc_async<int>(n, "trainer", "add", 1, 2).then([](troupe::rpc::future<int>) -> int {
    throw std::logic_error("plain exception");
  });
  try {
    std_threw.get();
    FAIL("the continuation's exception should be the future's error");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::remote_exception);
    CHECK(e.message().find("plain exception") != std::string::npos);
    CHECK(e.message().find("'add (then)'") != std::string::npos);
  }
  auto recovered = troupe::rpc_async<int>(n, "trainer", "fail", 0).then([](troupe::rpc::future<int> f) {
    try {
      return f.get();
    } catch (const troupe::error&) {
      return -1;
    }
  });
  CHECK(recovered.get() == -1);
  CHECK_THROWS_AS(troupe::rpc::future<int>().then([](troupe::rpc::future<int>) { return 0; }), troupe::error);

  troupe::test::release_children(n);
  CHECK(children.join(10s));
}

TEST_CASE("collect_all returns every value in order, or the first error", "[actors][rpc]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { serve(pipe.read()); });
  troupe::node n(troupe::test::test_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  n.store().wait({"ready"}, 10s);

  std::vector<troupe::rpc::future<int>> fs;
  for (int i = 0; i < 8; ++i) fs.push_back(troupe::rpc_async<int>(n, "trainer", "add", i, 100));
  const std::vector<int> values = troupe::rpc::collect_all(fs).get();
  REQUIRE(values.size() == 8);
  for (int i = 0; i < 8; ++i) CHECK(values[static_cast<std::size_t>(i)] == i + 100);

  std::vector<troupe::rpc::future<int>> some_fail = {troupe::rpc_async<int>(n, "trainer", "add", 1, 1),
                                                     troupe::rpc_async<int>(n, "trainer", "no_such_function", 1),
                                                     troupe::rpc_async<int>(n, "trainer", "fail", 0)};
  // The first failed one in order (unknown_function), not the later remote_exception.
  CHECK(code_of([&] { troupe::rpc::collect_all(some_fail).get(); }) == errc::unknown_function);

  std::vector<troupe::rpc::future<void>> chained;
  for (int i = 0; i < 3; ++i)
    chained.push_back(troupe::rpc_async<int>(n, "trainer", "add", i, i).then([](troupe::rpc::future<int> f) { (void)f.get(); }));
  CHECK_NOTHROW(troupe::rpc::collect_all(chained).get());
  CHECK(troupe::rpc::collect_all(std::vector<troupe::rpc::future<int>>{}).get().empty());
  CHECK_THROWS_AS(troupe::rpc::collect_all(std::vector<troupe::rpc::future<int>>(2)), troupe::error);

  troupe::test::release_children(n);
  CHECK(children.join(10s));
}

TEST_CASE("the worker list names every rank, and get_worker_info rejects unknown names", "[actors][rpc]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { serve(pipe.read()); });
  troupe::node n(troupe::test::test_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  const auto all = troupe::workers(n, 10s);  // waits for rank 1 to start
  REQUIRE(all.size() == 2);
  CHECK(all[0].name == "worker0");
  CHECK(all[0].rank == 0);
  CHECK(all[1].name == "trainer");
  CHECK(all[1].rank == 1);
  CHECK(all[1].world_size == 2);
  const troupe::worker_info t = troupe::get_worker_info(n, "trainer");
  CHECK(t.rank == 1);
  n.store().wait({"ready"}, 10s);  // rank 1 joins the job before it adds its functions
  CHECK(troupe::rpc_sync<int>(n, t.name, "add", 2, 3) == 5);
  try {
    troupe::get_worker_info(n, "trainr");
    FAIL("an unknown name should be rejected");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::bad_argument);
    CHECK(e.message().find("'trainr'") != std::string::npos);
    CHECK(e.message().find("worker0, trainer") != std::string::npos);
  }
  troupe::test::release_children(n);
  CHECK(children.join(10s));
}

TEST_CASE("the worker list times out naming what is missing while a rank has not started", "[actors][rpc]") {
  troupe::node n(troupe::test::test_options(0, 3, 0));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    troupe::workers(n, 300ms);
    FAIL("ranks 1 and 2 never start");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::timeout);
    CHECK(e.message().find("troupe/worker/1") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  n.shutdown(troupe::shutdown_mode::immediate);
}
