// The bucket actor (Note [bucket actor]).
#include "bucket_actor.hpp"

#include <caf/all.hpp>

#include <string>

namespace troupe::ddp::detail {

namespace {

struct bucket_state {
  bucket_spec spec;
  std::shared_ptr<bucket_shared> shared;
  std::size_t pending = 0;
  bool turn = false;
  std::int64_t step = 0;
};

using bucket_self = bucket_actor::stateful_pointer<bucket_state>;

/// Starts the reduction of the bucket; a failure becomes a work that throws in the final wait.
comm_result start_reduction(bucket_state& st) noexcept {
  const int b = st.spec.index;
  bucket_shared& sh = *st.shared;
  try {
    sh.events.wait(st.spec.params);  // Note [DDP on CUDA]
    sh.group.fault_point("allreduce", st.step);
    sh.group.note_next("bucket " + std::to_string(b));  // Note [hang blame]: reports name the bucket
    comm_result r = sh.hook(sh.group, st.spec.view);
    sh.group.note_next({});
    return r;
  } catch (const std::exception& e) {
    const auto* te = dynamic_cast<const error*>(&e);
    const error err = te != nullptr ? *te
                                    : error(errc::invalid_state, "communication hook of bucket " + std::to_string(b) +
                                                                     " threw: " + e.what());
    comm_result r;
    r.then = [err] { throw err; };
    return r;
  }
}

void try_launch(bucket_self self) {
  auto& st = self->state;
  if (st.pending != 0 || !st.turn) return;
  const auto launched_at = launch_board::clock::now();  // before the hook: a small work may finish at once
  st.shared->board.fill(st.spec.index, start_reduction(st), launched_at);
  if (st.spec.next) self->send(st.spec.next, turn_atom::value);
  st.pending = st.spec.params.size();
  st.turn = st.spec.index == 0;
}

bucket_actor::behavior_type bucket_behavior(bucket_self self, bucket_spec spec, std::shared_ptr<bucket_shared> shared) {
  auto& st = self->state;
  st.spec = std::move(spec);
  st.shared = std::move(shared);
  st.pending = st.spec.params.size();
  st.turn = st.spec.index == 0;
  return {
      [self](grad_ready_atom, std::size_t, std::int64_t step) {
        auto& s = self->state;
        if (s.pending > 0) --s.pending;
        s.step = step;
        try_launch(self);
      },
      [self](turn_atom) {
        self->state.turn = true;
        try_launch(self);
      },
      [self](reset_atom) {
        self->state.pending = self->state.spec.params.size();
        self->state.turn = self->state.spec.index == 0;
      },
  };
}

}  // namespace

bucket_actor spawn_bucket_actor(caf::actor_system& sys, bucket_spec spec, std::shared_ptr<bucket_shared> shared) {
  return sys.spawn(bucket_behavior, std::move(spec), std::move(shared));
}

}  // namespace troupe::ddp::detail
