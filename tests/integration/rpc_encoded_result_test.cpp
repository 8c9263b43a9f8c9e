// Served functions that encode their own result (rpc::encoded_result) or choose their error code
// (rpc::reply_error). The caller's interceptor sees the result. The callee's sees only what the
// codec writes under the served call's context (Note [codec context]), not bytes made beforehand.
#include <atomic>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/tensors/factories.hpp"

using namespace std::chrono_literals;
using troupe::errc;
using troupe::tensor;

namespace {

// Counts the tensors written and read under its scopes.
struct counting_interceptor : troupe::rpc::call_interceptor {
  std::atomic<int> written{0}, read{0};
  struct scope : troupe::rpc::call_scope {
    counting_interceptor* owner;
    explicit scope(counting_interceptor* o) : owner(o) {}
    void on_tensor_written(const tensor&) override { ++owner->written; }
    tensor on_tensor_read(tensor t) override {
      ++owner->read;
      return t;
    }
  };
  std::shared_ptr<troupe::rpc::call_scope> begin_call(const std::string&, const std::string&) override {
    return std::make_shared<scope>(this);
  }
  std::shared_ptr<troupe::rpc::call_scope> begin_serve(const std::string&, const std::string&, const std::vector<char>&) override {
    return std::make_shared<scope>(this);
  }
};

}  // namespace

TEST_CASE("a served function can answer with bytes it encoded or with its own error code", "[actors][rpc]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) {
    troupe::node n(troupe::test::test_options(1, 2, pipe.read()));
    auto counter = std::make_shared<counting_interceptor>();
    n.set_interceptor(counter);
    n.functions().add("encoded", [](int k) {
      // Encoded by the function itself, outside the served call's codec context.
      return troupe::rpc::encoded_result{troupe::rpc::encode_result<tensor>(troupe::full({k}, 2.5f))};
    });
    n.functions().add("refuse", [](int) -> int { throw troupe::rpc::reply_error(errc::invalid_state, "refused on purpose"); });
    n.store().set("ready", "1");
    n.store().get("done", 20s);
    n.store().set("served_written", std::to_string(counter->written.load()));
    n.set_interceptor(nullptr);
    n.shutdown(troupe::shutdown_mode::graceful, 10s);
  });
  troupe::node n(troupe::test::test_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  auto counter = std::make_shared<counting_interceptor>();
  n.set_interceptor(counter);
  n.store().wait({"ready"}, 10s);
  const auto t = troupe::rpc_sync<tensor>(n, "worker1", "encoded", 3);
  REQUIRE(t.sizes() == std::vector<std::int64_t>{3});
  CHECK(t.select(0, 2).item<float>() == 2.5f);
  CHECK(counter->read == 1);
  try {
    troupe::rpc_sync<int>(n, "worker1", "refuse", 1);
    FAIL("refuse returned");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::invalid_state);
    CHECK_THAT(e.message(), Catch::Contains("refused on purpose"));
  }
  n.store().set("done", "1");
  CHECK(n.store().get("served_written", 10s) == "0");
  n.set_interceptor(nullptr);
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
  CHECK(children.join(10s));
}
