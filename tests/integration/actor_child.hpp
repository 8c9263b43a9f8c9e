#pragma once
// The remote actor tests' child process. Rank 1 hosts an echo actor ("echo", untyped) and a
// typed adder ("adder"). It serves until rank 0 sets "done", then exits its actors and shuts down.

#include <caf/all.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "integration/node_harness.hpp"
#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/remote_actor.hpp"

namespace troupe::test {

using note_atom = caf::atom_constant<caf::atom("note")>;
using count_atom = caf::atom_constant<caf::atom("count")>;
using hold_atom = caf::atom_constant<caf::atom("hold")>;
using quit_atom = caf::atom_constant<caf::atom("quit")>;
using poke_atom = caf::atom_constant<caf::atom("poke")>;
using device_atom = caf::atom_constant<caf::atom("device")>;
using unsendable_atom = caf::atom_constant<caf::atom("unsendable")>;

/// A type no node announces: a message holding it cannot be serialized.
struct unannounced {
  std::int32_t x = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, unannounced& u) {
  return f(u.x);
}

/// A user struct with a tensor inside.
struct sample {
  std::int64_t step = 0;
  std::string tag;
  tensor data;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sample& x) {
  return f(caf::meta::type_name("test.sample"), x.step, x.tag, x.data);
}

using adder_actor = caf::typed_actor<caf::replies_to<std::int32_t, std::int32_t>::with<std::int32_t>>;
using other_actor = caf::typed_actor<caf::replies_to<std::string>::with<std::int32_t>>;

/// Options of an actor test node: the test types announced; `shm`: shared_memory_rpc.
inline node_options actor_options(int rank, int world, std::uint16_t port, bool shm = true) {
  auto o = test_options(rank, world, port);
  o.shared_memory_rpc = shm;
  add_actor_message_type<sample>(o, "test.sample");
  return o;
}

struct echo_state {
  std::int64_t notes = 0;
  std::int64_t next = 0;        // the sequence number expected next
  std::int64_t out_of_order = 0;
  std::vector<caf::response_promise> held;
};

/// Echoes ints (+1), strings (reversed), samples (step+1), tensors; names a tensor's device (-1: CPU); counts notes (one-way) and
/// checks their sequence; holds `hold` requests unanswered; quits on `quit`.
inline caf::behavior echo_actor(caf::stateful_actor<echo_state>* self) {
  auto note = [self](std::int64_t seq) {
    ++self->state.notes;
    if (seq != self->state.next) ++self->state.out_of_order;
    self->state.next = seq + 1;
  };
  return {
      [](std::int32_t x) { return x + 1; },
      [](const std::string& s) { return std::string(s.rbegin(), s.rend()); },
      [](sample& s) {
        s.step += 1;
        return s;
      },
      [](const tensor& t) { return t; },
      [](device_atom, const tensor& t) { return std::int32_t{t.device().is_cuda() ? t.device().index : -1}; },
      [note](note_atom, std::int64_t seq) { note(seq); },
      [note](note_atom, std::int64_t seq, const tensor&) { note(seq); },
      [self](count_atom) { return std::make_tuple(self->state.notes, self->state.out_of_order); },
      [self](hold_atom) {
        auto rp = self->make_response_promise();
        self->state.held.push_back(rp);
        return rp;
      },
      [](unsendable_atom) { return unannounced{7}; },  // a response that cannot be sent
      [self](quit_atom) {
        self->quit();
        return std::int32_t{0};
      },
  };
}

inline adder_actor::behavior_type adder(adder_actor::pointer) {
  return {[](std::int32_t a, std::int32_t b) { return a + b; }};
}

/// Rank 1 of a two-process actor test.
inline void actor_child(port_pipe& pipe, bool shm = true) {
  node n(actor_options(1, 2, pipe.read(), shm));
  auto echo = n.system().spawn(echo_actor);
  auto add = n.system().spawn(adder);
  publish_actor(n, echo, "echo");
  publish_actor(n, add, "adder");
  n.store().set("ready/1", "1");
  n.store().get("done", std::chrono::seconds(120));
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(add, caf::exit_reason::user_shutdown);
  echo = nullptr;
  add = nullptr;
  n.shutdown(shutdown_mode::graceful, std::chrono::seconds(10));
}

/// The code of the troupe::error `fn` throws (ok when none); its message into `message`.
inline errc code_of(const std::function<void()>& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const error& e) {
    if (message) *message = e.message();
    return e.code();
  }
  return errc::ok;
}

/// The troupe::error of a caf::error (any code), rendered.
inline troupe::error as_error(const caf::error& e) { return from_caf_error(e, "actor message"); }

}  // namespace troupe::test
