// The bucket actor (Note [DDP reducer]).
#include "bucket_actor.hpp"

#include "reducer.hpp"

namespace troupe::ddp::detail {

namespace {

void try_launch(caf::stateful_actor<bucket_state>* self) {
  auto& st = self->state;
  if (st.pending != 0 || !st.turn) return;
  st.owner->launch(st.index);  // never throws: failures become a failed work
  if (st.next) self->send(st.next, turn_atom::value);
  st.pending = st.total;
  st.turn = st.index == 0;
}

caf::behavior bucket_actor(caf::stateful_actor<bucket_state>* self, reducer* owner, int index, std::size_t total,
                           caf::actor next) {
  auto& st = self->state;
  st.index = index;
  st.total = total;
  st.pending = total;
  st.turn = index == 0;
  st.owner = owner;
  st.next = std::move(next);
  return {
      [self](grad_ready_atom, std::size_t) {
        if (self->state.pending > 0) --self->state.pending;
        try_launch(self);
      },
      [self](turn_atom) {
        self->state.turn = true;
        try_launch(self);
      },
      [self](reset_atom) {
        self->state.pending = self->state.total;
        self->state.turn = self->state.index == 0;
      },
  };
}

}  // namespace

caf::actor spawn_bucket_actor(caf::actor_system& sys, reducer& owner, int index, std::size_t total, caf::actor next) {
  return sys.spawn(bucket_actor, &owner, index, total, std::move(next));
}

}  // namespace troupe::ddp::detail
