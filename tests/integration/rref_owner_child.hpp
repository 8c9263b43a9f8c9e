#pragma once
// The owner process of the RRef owner-loss tests (rref_owner_lost_test.cpp,
// rref_fork_owner_lost_test.cpp). worker1 serves "seven", "never" (waits 20 s for a store key),
// "tally" and the method "inc" of tally. Then it waits to be SIGKILLed.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "integration/node_harness.hpp"
#include "troupe/actors/rref/rref.hpp"

namespace troupe::test {

/// A value with a method (rref<tally>::rpc_sync("inc", d)).
struct tally {
  std::int64_t n = 0;
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & n; }
};

/// The body of the forked owner process, rank 1 of `world`.
inline void rref_owner_child(port_pipe& pipe, int world) {
  using namespace std::chrono_literals;
  node n(test_options(1, world, pipe.read()));
  rref_context ctx(n);
  add_function(ctx, "seven", [] { return 7; });
  add_function(ctx, "never", [&n] { return n.store().get("never", 20s).size(); });
  add_function(ctx, "tally", [] { return tally{}; });
  add_method<tally>(ctx, "inc", [](tally& t, std::int64_t d) { return t.n += d; });
  n.store().set("ready/1", "1");
  n.store().get("done", 30s);  // killed before this
}

/// The error code `fn` throws (ok if none); its message into `message`.
inline errc code_of(const std::function<void()>& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const error& e) {
    if (message) *message = e.message();
    return e.code();
  }
  return errc::ok;
}

}  // namespace troupe::test
