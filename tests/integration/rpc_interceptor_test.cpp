// Multi-process tests of the call interceptor seam (Note [call interceptor]):
// - tensors reported both ways, a tensor rewritten on read;
// - meta bytes in both directions, also through the transport hook;
// - the served scope entered around a nested call;
// - interceptor errors.
#include <atomic>
#include <future>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"

using namespace std::chrono_literals;
using troupe::errc;
using troupe::tensor;

namespace {

std::vector<char> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const std::vector<char>& b) { return {b.begin(), b.end()}; }

// Counts tensors, attaches "<tag>:<function>[<meta it got>]" as meta, adds `bump` to every
// tensor it reads, and throws where the function name asks it to.
struct test_interceptor : troupe::rpc::call_interceptor {
  std::atomic<int> written{0}, read{0}, nested_on_serve{0};
  std::atomic<int> serving{0};  // serve scopes entered and not left (enter() / leave())
  std::mutex mutex;
  std::vector<std::string> metas_in;  // every meta an on_meta / begin_serve got
  double bump = 0;

  void record(const std::string& m) {
    std::lock_guard<std::mutex> lock(mutex);
    metas_in.push_back(m);
  }
  std::vector<std::string> metas() {
    std::lock_guard<std::mutex> lock(mutex);
    return metas_in;
  }

  struct scope : troupe::rpc::call_scope {
    test_interceptor* owner;
    std::string tag, function, got;
    scope(test_interceptor* o, std::string t, std::string f, std::string g) : owner(o), tag(std::move(t)), function(std::move(f)), got(std::move(g)) {}
    void on_tensor_written(const tensor&) override { ++owner->written; }
    tensor on_tensor_read(tensor t) override {
      if (function == "bad_read") throw std::runtime_error("interceptor refuses to read");
      ++owner->read;
      return owner->bump != 0 ? troupe::add(t, owner->bump) : t;
    }
    std::vector<char> take_meta() override { return bytes_of(tag + ":" + function + "[" + got + "]"); }
    void enter() override {
      if (tag == "serve") ++owner->serving;
    }
    void leave() override {
      if (tag == "serve") --owner->serving;
    }
    void on_meta(const std::vector<char>& m) override {
      if (function == "bad_meta") throw troupe::error(errc::protocol_violation, "interceptor rejects the response meta");
      owner->record(text_of(m));
    }
  };

  std::shared_ptr<troupe::rpc::call_scope> begin_call(const std::string&, const std::string& function) override {
    if (function == "bad_call") throw std::runtime_error("interceptor refuses to call");
    if (serving > 0) ++nested_on_serve;  // begun while a served function runs
    return std::make_shared<scope>(this, "call", function, "");
  }
  std::shared_ptr<troupe::rpc::call_scope> begin_serve(const std::string&, const std::string& function,
                                                       const std::vector<char>& meta) override {
    if (function == "bad_serve") throw std::runtime_error("interceptor refuses to serve");
    record(text_of(meta));
    return std::make_shared<scope>(this, "serve", function, text_of(meta));
  }
};

// Records the meta of every request the hook sees arriving.
struct meta_hook : troupe::transport_hook {
  std::mutex mutex;
  std::vector<std::string> request_metas;
  troupe::transport_decision on_receive(troupe::envelope& e) override {
    std::lock_guard<std::mutex> lock(mutex);
    if (e.kind == troupe::message_kind::rpc_request) request_metas.push_back(text_of(e.meta));
    return {};
  }
};

// worker1: serves tensor functions under a test_interceptor (bump 1) and reports what it saw.
void serving_child(troupe::test::port_pipe& pipe) {
  auto ic = std::make_shared<test_interceptor>();
  ic->bump = 1;
  auto hook = std::make_shared<meta_hook>();
  troupe::rpc::registry reg;
  troupe::node n(troupe::test::test_options(1, 2, pipe.read()), reg, hook);
  n.set_interceptor(ic);
  n.functions().add("pair", [](tensor a, std::vector<tensor> b) { return std::make_tuple(a, troupe::add(b.at(0), b.at(1))); });
  for (const char* f : {"identity", "bad_serve", "bad_read", "bad_meta"}) n.functions().add(f, [](tensor a) { return a; });
  n.functions().add("nested", [&n, ic](int x) {
    const bool served = ic->serving == 1;
    const int twice = troupe::rpc_sync<int>(n, "worker0", "twice", x, 5s);
    const bool still = ic->serving == 1;
    return std::make_tuple(served && still, twice);
  });
  n.functions().add("stats", [ic, hook] {
    std::lock_guard<std::mutex> lock(hook->mutex);
    return std::make_tuple(ic->written.load(), ic->read.load(), ic->nested_on_serve.load(), ic->metas(), hook->request_metas);
  });
  troupe::test::serve_until_done(n, "ready", 30s);
}

using stats_t = std::tuple<int, int, int, std::vector<std::string>, std::vector<std::string>>;

// Rank 0 with a serving child; the test body runs between.
template <class Body>
void with_child(Body body) {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { serving_child(pipe); });
  troupe::node n(troupe::test::test_options(0, 2, 0));
  n.functions().add("twice", [](int x) { return 2 * x; });
  pipe.publish(n.port(), 1);
  n.store().wait({"ready"}, 10s);
  body(n);
  troupe::test::release_children(n);
  CHECK(children.join(10s));
}

errc code_of(const std::function<void()>& f, std::string* text = nullptr) {
  try {
    f();
  } catch (const troupe::error& e) {
    if (text) *text = e.message();
    return e.code();
  }
  return errc::ok;
}

}  // namespace

TEST_CASE("an interceptor sees every tensor of a call both ways and its meta bytes round-trip", "[actors][rpc][interceptor]") {
  with_child([](troupe::node& n) {
    auto ic = std::make_shared<test_interceptor>();
    n.set_interceptor(ic);
    const std::vector<tensor> two{troupe::ones({3}), troupe::full({3}, 2.0)};
    auto [a, b] = troupe::rpc_sync<std::tuple<tensor, tensor>>(n, "worker1", "pair", troupe::ones({2}), two, 5s);
    CHECK(ic->written == 3);  // the argument and the two in the vector
    CHECK(ic->read == 2);     // the two results, decoded once
    CHECK(a.data<float>()[1] == 1.0f + 1.0f);  // worker1 read 1 (+1 bump) and returned it; we do not bump
    CHECK(b.data<float>()[0] == (1.0f + 1.0f) + (2.0f + 1.0f));
    REQUIRE(ic->metas() == std::vector<std::string>{"serve:pair[call:pair[]]"});

    n.set_interceptor(nullptr);  // uninstalled: its counters stay, stats travel without meta
    const auto s = troupe::rpc_sync<stats_t>(n, "worker1", "stats", 5s);
    CHECK(std::get<0>(s) == 2);  // worker1 wrote the two results
    CHECK(std::get<1>(s) == 3);  // and read the three arguments
    CHECK(std::get<3>(s) == std::vector<std::string>{"call:pair[]", ""});  // pair's meta, then stats' (none)
    CHECK(std::get<4>(s) == std::get<3>(s));  // the transport hook saw the same meta bytes
    CHECK(ic->written == 3);
  });
}

TEST_CASE("a tensor the interceptor rewrites on read is what the function and the caller get", "[actors][rpc][interceptor]") {
  with_child([](troupe::node& n) {
    auto ic = std::make_shared<test_interceptor>();
    ic->bump = 10;
    n.set_interceptor(ic);
    auto f = troupe::rpc_async<tensor>(n, "worker1", "identity", troupe::full({4}, 5.0), 5s);
    const tensor first = f.get();
    CHECK(first.data<float>()[3] == 5.0f + 1.0f + 10.0f);  // +1 on worker1, +10 here
    // get() again, then() and wait_all: the result was decoded once, under the scope.
    CHECK(f.get().data<float>()[3] == 16.0f);
    std::promise<float> from_then;
    f.then([&](troupe::rpc::future<tensor> g) { from_then.set_value(g.get().data<float>()[0]); });
    CHECK(troupe::rpc::wait_all(std::vector<troupe::rpc::future<tensor>>{f}, 1s));
    auto then_value = from_then.get_future();
    REQUIRE(then_value.wait_for(5s) == std::future_status::ready);  // then() runs on the executor
    CHECK(then_value.get() == 16.0f);
    CHECK(ic->read == 1);
    CHECK(ic->metas().size() == 1);  // on_meta once
  });
}

TEST_CASE("a served function runs with its serve scope entered and its nested call begins inside it", "[actors][rpc][interceptor]") {
  with_child([](troupe::node& n) {
    auto ic = std::make_shared<test_interceptor>();
    n.set_interceptor(ic);
    auto [scoped, twice] = troupe::rpc_sync<std::tuple<bool, int>>(n, "worker1", "nested", 21, 5s);
    CHECK(scoped);
    CHECK(twice == 42);
    n.set_interceptor(nullptr);
    const auto s = troupe::rpc_sync<stats_t>(n, "worker1", "stats", 5s);
    CHECK(std::get<2>(s) == 1);  // worker1's begin_call ran while its serve scope of 'nested' was entered
    // worker0 served 'twice' with the meta of worker1's call scope, then got nested's answer.
    CHECK(ic->metas() == std::vector<std::string>{"call:twice[]", "serve:nested[call:nested[]]"});
    CHECK(ic->serving == 0);  // worker0 left the serve scope of 'twice'
  });
}

TEST_CASE("an exception thrown by the interceptor fails that call with its text and later calls work", "[actors][rpc][interceptor]") {
  with_child([](troupe::node& n) {
    auto ic = std::make_shared<test_interceptor>();
    n.set_interceptor(ic);
    const auto t = troupe::ones({2});
    std::string text;
    CHECK(code_of([&] { troupe::rpc_sync<tensor>(n, "worker1", "bad_call", t, 5s); }, &text) == errc::invalid_state);
    CHECK_THAT(text, Catch::Contains("interceptor refuses to call") && Catch::Contains("bad_call"));
    CHECK(code_of([&] { troupe::rpc_sync<tensor>(n, "worker1", "bad_serve", t, 5s); }, &text) == errc::remote_exception);
    CHECK_THAT(text, Catch::Contains("interceptor refuses to serve") && Catch::Contains("worker1"));
    CHECK(code_of([&] { troupe::rpc_sync<tensor>(n, "worker1", "bad_read", t, 5s); }, &text) == errc::remote_exception);
    CHECK_THAT(text, Catch::Contains("interceptor refuses to read"));
    auto f = troupe::rpc_async<tensor>(n, "worker1", "bad_meta", t, 5s);
    CHECK(code_of([&] { f.get(); }, &text) == errc::protocol_violation);
    CHECK_THAT(text, Catch::Contains("rejects the response meta"));
    CHECK(code_of([&] { f.get(); }) == errc::protocol_violation);  // the same failure, not a second decode
    CHECK(ic->serving == 0);  // no failure left a scope entered
    CHECK(troupe::rpc_sync<tensor>(n, "worker1", "identity", t, 5s).data<float>()[1] == 2.0f);
  });
}
