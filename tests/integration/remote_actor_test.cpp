// Remote actors across processes (Note [remote actors]): messages of every kind and size,
// order, lookup errors, a request to an exited actor, value semantics of tensors.
#include <catch2/catch.hpp>

#include "integration/actor_child.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using namespace troupe::test;
using troupe::errc;

namespace {

// A request from a fresh scoped actor: the response, or the error as a troupe::error.
template <class R, class... Ts>
R ask(caf::actor_system& sys, const caf::actor& to, std::chrono::milliseconds timeout, Ts&&... xs) {
  caf::scoped_actor self{sys};
  R out{};
  caf::error err;
  self->request(to, timeout, std::forward<Ts>(xs)...).receive([&](R& r) { out = std::move(r); }, [&](caf::error& e) { err = e; });
  if (err) throw as_error(err);
  return out;
}

struct two_nodes {
  explicit two_nodes(bool shm = true) : children(troupe::spawn(1, [this, shm](int) { actor_child(pipe, shm); })), n(actor_options(0, 2, 0, shm)) {
    pipe.publish(n.port(), 1);
    echo = troupe::lookup_actor(n, "worker1", "echo", 10s);
  }
  ~two_nodes() {
    echo = nullptr;
    try {
      release_children(n);
      children.join(20s);
    } catch (...) {
    }
  }
  port_pipe pipe;
  troupe::spawn_context children;
  troupe::node n;
  caf::actor echo;
};

void check_round_trips(bool shm) {
  two_nodes t(shm);
  auto& sys = t.n.system();
  CHECK(ask<std::int32_t>(sys, t.echo, 5s, std::int32_t{41}) == 42);
  CHECK(ask<std::string>(sys, t.echo, 5s, std::string("abc")) == "cba");
  CHECK(ask<std::string>(sys, t.echo, 5s, std::string()).empty());
  for (std::int64_t bytes : {std::int64_t{0}, std::int64_t{1}, std::int64_t{4096}, std::int64_t{1} << 20, std::int64_t{64} << 20}) {
    auto data = byte_pattern(bytes, static_cast<unsigned>(bytes));
    auto back = ask<troupe::tensor>(sys, t.echo, 20s, data);
    CHECK(same_bytes(back, data));
    troupe::test::sample s{7, "s" + std::to_string(bytes), data};
    auto got = ask<troupe::test::sample>(sys, t.echo, 20s, s);
    CHECK(got.step == 8);
    CHECK(got.tag == s.tag);
    CHECK(same_bytes(got.data, data));
  }
  caf::scoped_actor self{sys};
  for (std::int64_t i = 0; i < 100; ++i) self->send(t.echo, note_atom::value, i);
  std::tuple<std::int64_t, std::int64_t> counted;
  self->request(t.echo, 5s, count_atom::value).receive([&](std::int64_t n, std::int64_t ooo) { counted = {n, ooo}; }, [&](caf::error& e) { FAIL(sys.render(e)); });
  CHECK(std::get<0>(counted) == 100);
  CHECK(std::get<1>(counted) == 0);
}

}  // namespace

TEST_CASE("remote actors answer requests and take sends with ints and strings and structs and tensors up to 64 MB on one host", "[actors][integration]") {
  check_round_trips(true);
}

TEST_CASE("remote actors carry tensors up to 64 MB as inline bytes without shared memory", "[actors][integration]") {
  check_round_trips(false);
}

TEST_CASE("messages from one sender arrive in send order when large tensors and small messages interleave", "[actors][integration]") {
  two_nodes t(false);
  auto& sys = t.n.system();
  caf::scoped_actor self{sys};
  auto big = byte_pattern(8 << 20, 3);
  std::int64_t seq = 0;
  for (int round = 0; round < 6; ++round) {
    self->send(t.echo, note_atom::value, seq++, round == 3 ? byte_pattern(64 << 20, 4) : big);
    for (int i = 0; i < 20; ++i) self->send(t.echo, note_atom::value, seq++);
  }
  self->request(t.echo, 30s, count_atom::value)
      .receive(
          [&](std::int64_t n, std::int64_t ooo) {
            CHECK(n == seq);
            CHECK(ooo == 0);
          },
          [&](caf::error& e) { FAIL(sys.render(e)); });
}

TEST_CASE("a sent tensor keeps the value it had when it was sent", "[actors][integration]") {
  two_nodes t(true);
  auto& sys = t.n.system();
  for (std::int64_t bytes : {std::int64_t{64}, std::int64_t{2} << 20}) {
    auto data = byte_pattern(bytes, 9);
    const auto original = data.clone();
    caf::scoped_actor self{sys};
    auto h = self->request(t.echo, 10s, data);
    static_cast<unsigned char*>(data.data_ptr())[0] ^= 0xff;  // the caller changes its tensor after the send
    troupe::tensor back;
    std::move(h).receive([&](troupe::tensor& r) { back = r; }, [&](caf::error& e) { FAIL(sys.render(e)); });
    CHECK(same_bytes(back, original));
    CHECK_FALSE(same_bytes(back, data));
  }
}

TEST_CASE("a lookup of a missing name or with the wrong interface is an error naming the worker and the name and the interfaces", "[actors][integration]") {
  two_nodes t;
  std::string message;
  CHECK(code_of([&] { troupe::lookup_actor(t.n, "worker1", "nobody", 200ms); }, &message) == errc::timeout);
  CHECK_THAT(message, Catch::Contains("worker1") && Catch::Contains("nobody"));
  CHECK(code_of([&] { troupe::lookup_actor<other_actor>(t.n, "worker1", "adder", 2s); }, &message) == errc::bad_argument);
  CHECK_THAT(message, Catch::Contains("worker1") && Catch::Contains("adder") && Catch::Contains("@i32") && Catch::Contains("@str"));
  CHECK(code_of([&] { troupe::lookup_actor<other_actor>(t.n, "worker1", "echo", 2s); }, &message) == errc::bad_argument);
  CHECK_THAT(message, Catch::Contains("untyped"));
  auto add = troupe::lookup_actor<adder_actor>(t.n, "worker1", "adder", 2s);
  caf::scoped_actor self{t.n.system()};
  std::int32_t sum = 0;
  self->request(add, 5s, std::int32_t{2}, std::int32_t{3}).receive([&](std::int32_t r) { sum = r; }, [&](caf::error& e) { FAIL(t.n.system().render(e)); });
  CHECK(sum == 5);
}

TEST_CASE("a request to a remote actor that exited fails at once and its monitor gets down_msg", "[actors][integration]") {
  two_nodes t;
  auto& sys = t.n.system();
  caf::scoped_actor self{sys};
  self->monitor(t.echo);
  CHECK(ask<std::int32_t>(sys, t.echo, 5s, quit_atom::value) == 0);
  bool down = false;
  self->receive([&](const caf::down_msg& d) { down = d.source == t.echo.address(); }, caf::after(5s) >> [] {});
  CHECK(down);
  const auto t0 = std::chrono::steady_clock::now();
  std::string message;
  CHECK(code_of([&] { ask<std::int32_t>(sys, t.echo, 10s, std::int32_t{1}); }, &message) != errc::ok);
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  CHECK_THAT(message, Catch::Contains("worker1"));
  // A fresh handle of the exited actor (its name is still published) fails at once as well.
  auto again = troupe::lookup_actor(t.n, "worker1", "echo", 2s);
  const auto t1 = std::chrono::steady_clock::now();
  CHECK(code_of([&] { ask<std::int32_t>(sys, again, 10s, std::int32_t{1}); }, &message) != errc::ok);
  CHECK(std::chrono::steady_clock::now() - t1 < 2s);
}

TEST_CASE("a response that cannot be serialized fails its request at once with the reason", "[actors][integration]") {
  two_nodes t;
  std::string message;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(code_of([&] { ask<std::int32_t>(t.n.system(), t.echo, 20s, unsendable_atom::value); }, &message) == errc::bad_argument);
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);  // not the request's timeout
  CHECK_THAT(message, Catch::Contains("cannot serialize") && Catch::Contains("worker1"));
  CHECK(ask<std::int32_t>(t.n.system(), t.echo, 5s, std::int32_t{1}) == 2);  // the actor and the connection live on
}
