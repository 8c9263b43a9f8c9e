// Deferred replies (Note [deferred reply]): a served function answers later, from another call's
// thread, through the served call's defer().
#include <atomic>
#include <mutex>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/tensors/factories.hpp"

using namespace std::chrono_literals;
using troupe::errc;
using troupe::tensor;

namespace {

// The parked reply of worker1's "park" call.
struct parked {
  std::mutex mutex;
  std::shared_ptr<troupe::rpc::reply_later> reply;
  int base = 0;
};

// Counts tensors written under served scopes (the deferred encode must be one of them).
struct written_counter : troupe::rpc::call_interceptor {
  std::atomic<int> written{0};
  struct scope : troupe::rpc::call_scope {
    written_counter* owner;
    explicit scope(written_counter* o) : owner(o) {}
    void on_tensor_written(const tensor&) override { ++owner->written; }
  };
  std::shared_ptr<troupe::rpc::call_scope> begin_call(const std::string&, const std::string&) override { return nullptr; }
  std::shared_ptr<troupe::rpc::call_scope> begin_serve(const std::string&, const std::string&, const std::vector<char>&) override {
    return std::make_shared<scope>(this);
  }
};

void worker(troupe::test::port_pipe& pipe) {
  troupe::node n(troupe::test::test_options(1, 2, pipe.read()));
  auto counter = std::make_shared<written_counter>();
  n.set_interceptor(counter);
  auto slot = std::make_shared<parked>();
  troupe::node* self = &n;
  n.functions().add("park", [slot, self](troupe::rpc::served_call& call, int base) {
    {
      std::lock_guard<std::mutex> lock(slot->mutex);
      slot->reply = call.defer();
      slot->base = base;
    }
    self->store().set("parked", "1");
    return troupe::rpc::deferred{};
  });
  n.functions().add("release", [slot](int add) {
    std::shared_ptr<troupe::rpc::reply_later> r;
    int base = 0;
    {
      std::lock_guard<std::mutex> lock(slot->mutex);
      r = std::move(slot->reply);
      base = slot->base;
    }
    if (!r) throw std::runtime_error("nothing parked");
    r->complete<int>(base + add);
    r->complete<int>(-1);  // later answers are ignored
    return 0;
  });
  n.functions().add("park_tensor", [slot, self](troupe::rpc::served_call& call, int) {
    {
      std::lock_guard<std::mutex> lock(slot->mutex);
      slot->reply = call.defer();
    }
    self->store().set("parked_tensor", "1");
    return troupe::rpc::deferred{};
  });
  n.functions().add("release_tensor", [slot](int k) {
    std::lock_guard<std::mutex> lock(slot->mutex);
    if (!slot->reply) throw std::runtime_error("nothing parked");
    slot->reply->complete<tensor>(troupe::full({k}, 1.5));
    slot->reply.reset();
    return 0;
  });
  n.functions().add("drop", [](troupe::rpc::served_call& call, int) {
    (void)call.defer();  // the handle dies here: the caller must hear of it
    return troupe::rpc::deferred{};
  });
  n.functions().add("throw_after", [](troupe::rpc::served_call& call, int) -> troupe::rpc::deferred {
    auto r = call.defer();
    throw std::runtime_error("failed after deferring");
  });
  n.functions().add("defer_twice", [](troupe::rpc::served_call& call, int) {
    auto a = call.defer();
    auto b = call.defer();  // throws invalid_state
    return troupe::rpc::deferred{};
  });
  n.store().set("ready", "1");
  n.store().get("done", 30s);
  n.store().set("served_tensors", std::to_string(counter->written.load()));
  n.set_interceptor(nullptr);
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
}

errc code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const troupe::error& e) {
    return e.code();
  }
  return errc::ok;
}

void deferred_replies_work() {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { worker(pipe); });
  troupe::node n(troupe::test::test_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  n.store().wait({"ready"}, 10s);

  auto parked_call = troupe::rpc_async<int>(n, "worker1", "park", 40);
  n.store().wait({"parked"}, 10s);     // the function returned without answering
  CHECK_FALSE(parked_call.is_ready());
  CHECK(troupe::rpc_sync<int>(n, "worker1", "release", 2) == 0);
  REQUIRE(parked_call.wait(5s));
  CHECK(parked_call.get() == 42);

  auto tensor_call = troupe::rpc_async<tensor>(n, "worker1", "park_tensor", 0);
  n.store().wait({"parked_tensor"}, 10s);
  troupe::rpc_sync<int>(n, "worker1", "release_tensor", 3);
  const auto t = tensor_call.get();
  REQUIRE(t.numel() == 3);
  CHECK(t.select(0, 2).item<float>() == 1.5f);

  CHECK(code_of([&] { troupe::rpc_sync<int>(n, "worker1", "drop", 0, 5s); }) == errc::invalid_state);
  CHECK(code_of([&] { troupe::rpc_sync<int>(n, "worker1", "throw_after", 0, 5s); }) == errc::remote_exception);
  CHECK(code_of([&] { troupe::rpc_sync<int>(n, "worker1", "defer_twice", 0, 5s); }) == errc::remote_exception);

  n.store().set("done", "1");
  CHECK(n.store().get("served_tensors", 10s) == "1");  // the deferred tensor passed the serve scope
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
  CHECK(children.join(10s));
}

}  // namespace

TEST_CASE("a served function can answer later through its served call's defer on the direct channel", "[actors][rpc]") {
  deferred_replies_work();
}

TEST_CASE("a function that takes the served call, run outside a served call, is an invalid_state error", "[actors][rpc]") {
  troupe::rpc::registry reg;
  reg.add("later", [](troupe::rpc::served_call& call, int) {
    (void)call.defer();
    return troupe::rpc::deferred{};
  });
  const auto fn = reg.find("later");
  REQUIRE(fn);
  CHECK(fn->signature.find("(int32)") != std::string::npos);  // the served call is no argument
  CHECK(code_of([&] { fn->invoke(troupe::rpc::plain_context, troupe::rpc::encode_args(1), [] {}, nullptr); }) == errc::invalid_state);
  CHECK(code_of([&] { fn->invoke_held(troupe::rpc::plain_context, troupe::rpc::encode_args(1), [] {}); }) == errc::not_supported);
}
