// Note [codec context] (troupe/actors/rpc/codec_context.hpp): every encode and decode follows
// the context its node built for it. That holds also when a served function calls another peer
// with other settings on the same thread, while its answer goes to the first peer.
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/shared_memory.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using troupe::tensor;

namespace {

constexpr std::int64_t big = (2 << 20) + 8;  // over the 1 MiB shared-memory threshold

// Logs "<kind>:<function> <written>/<read>" for every scope when its message's meta is taken
// (after the encode of its request or answer, before it is sent).
struct logging_interceptor : troupe::rpc::call_interceptor {
  std::mutex mutex;
  std::vector<std::string> log;

  struct scope : troupe::rpc::call_scope {
    logging_interceptor* owner;
    std::string name;
    int written = 0, read = 0;
    scope(logging_interceptor* o, std::string n) : owner(o), name(std::move(n)) {}
    void on_tensor_written(const tensor&) override { ++written; }
    tensor on_tensor_read(tensor t) override {
      ++read;
      return t;
    }
    std::vector<char> take_meta() override {
      std::lock_guard<std::mutex> lock(owner->mutex);
      owner->log.push_back(name + " " + std::to_string(written) + "/" + std::to_string(read));
      return {};
    }
  };

  std::shared_ptr<troupe::rpc::call_scope> begin_call(const std::string&, const std::string& function) override {
    return std::make_shared<scope>(this, "call:" + function);
  }
  std::shared_ptr<troupe::rpc::call_scope> begin_serve(const std::string&, const std::string& function,
                                                       const std::vector<char>&) override {
    return std::make_shared<scope>(this, "serve:" + function);
  }
  std::vector<std::string> entries() {
    std::lock_guard<std::mutex> lock(mutex);
    return log;
  }
};

// worker1, in a process of its own: relays worker0's tensor after a nested call to worker2.
void relay_child(troupe::test::port_pipe& pipe) {
  auto ic = std::make_shared<logging_interceptor>();
  troupe::node n(troupe::test::test_options(1, 3, pipe.read()));
  n.set_interceptor(ic);
  // Runs on worker1 while its answer to worker0 is pending: the nested call goes to worker2.
  n.functions().add("relay", [&n](tensor t) {
    const bool came_shared = troupe::is_shared(t);
    auto [went_shared, intact] = troupe::rpc_sync<std::tuple<bool, bool>>(n, "worker2", "route", troupe::test::byte_pattern(big, 2), 10s);
    return std::make_tuple(t, came_shared, went_shared, intact);
  });
  n.functions().add("log", [ic] { return ic->entries(); });
  n.store().set("ready", "1");
  n.store().get("done", 30s);
  n.set_interceptor(nullptr);
  n.shutdown(troupe::shutdown_mode::immediate);
}

}  // namespace

TEST_CASE("a served function's nested call to another peer encodes by its own context, not by the served call's",
          "[actors][rpc][integration]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { relay_child(pipe); });
  troupe::node n0(troupe::test::test_options(0, 3, 0));
  pipe.publish(n0.port(), 1);
  auto no_shm = troupe::test::test_options(2, 3, n0.port());
  no_shm.shared_memory_rpc = false;  // worker2 takes large tensors as bytes only
  troupe::node n2(no_shm);
  n2.functions().add("route", [](tensor t) {
    return std::make_tuple(troupe::is_shared(t), troupe::test::same_bytes(t, troupe::test::byte_pattern(big, 2)));
  });
  n0.store().wait({"ready"}, 10s);

  const auto sent = troupe::test::byte_pattern(big, 1);
  auto [back, came_shared, went_shared, intact] =
      troupe::rpc_sync<std::tuple<tensor, bool, bool, bool>>(n0, "worker1", "relay", sent, 10s);
  CHECK(came_shared);         // worker0 -> worker1 (another process of this host): a shared-memory segment
  CHECK_FALSE(went_shared);   // worker1 -> worker2, inside the served call: bytes, by worker2's context
  CHECK(intact);
  CHECK(troupe::is_shared(back));  // worker1's answer after the nested call: shared memory again
  CHECK(troupe::test::same_bytes(back, sent));
  // Each scope saw its own message's tensors only: the nested call's argument is not the answer's.
  const auto log = troupe::rpc_sync<std::vector<std::string>>(n0, "worker1", "log", 10s);
  CHECK(log == std::vector<std::string>{"call:route 1/0", "serve:relay 1/1"});

  n0.store().set("done", "1");
  CHECK(children.join(20s));
  n2.shutdown(troupe::shutdown_mode::immediate);
  n0.shutdown(troupe::shutdown_mode::immediate);
}
