// The router's courier actor (context_impl.hpp): tombstone sweeps, the child_acks the router
// sends itself, and batched user_deletes.
//
// Note [release batching]
// A fork that enters DELETING (Note [user_rref actor]) hands its user_delete to the courier. It
// quits once nothing else is pending; it does not wait for the owner's answer itself. The
// courier collects the deletes per owner for rref_options::release_window. It then sends each
// owner's service one user_delete_batch carrying all of them, retried like every control
// message until answered. The service delivers each delete to its owner actor (Note [rref
// service]). A batch also goes at once when it reaches max_delete_batch deletes.
//
// The hand-over is two lists in the router (context_impl::handover_, under its own mutex), not a
// message each. One holds a released handle's release, with the creator fork's remote_done when
// the handle carried it (handle::watch). The other holds a DELETING fork's user_delete. Only the
// first hand-over of a window, or a full delete list, sends the courier a handover_atom. So a
// window of releases schedules the courier twice (that message, the timer), not once per
// release. The thread that drops a handle wakes nobody; in a remote + to_here + release loop
// that wake-up would be on the loop's critical path. Releases reach their forks when the window
// ends; their deletes go one window later. With release_window 0 nothing waits: releases go
// straight to the fork, each delete in its own message.
//
//   handle released --hand_release--> router releases += r; first of the window: handover_atom
//   fork DELETING --send_delete--> router deletes += d; first of the window: handover_atom
//   handover_atom --> courier takes the deletes into deletes[owner]; sends full batches; arms timer
//   window over (flush) --> takes both lists (the next hand-over asks again); passes each release
//                           to its fork; one user_delete_batch per owner (retried; idempotent, G1)
//
// Each delete counts in the router's in_flight_ from the hand-over until its batch is answered
// or fails for good. So wait_quiescent and shutdown still see it. Cost: the owner deletes up
// to two windows after the handle's release. Gain: one message, one owner wake-up and one
// answer per batch instead of per fork (figures in docs/rref.md). A released fork's actor ends
// at once, so a tight remote + to_here loop does not pay its predecessor's release.
#include <caf/all.hpp>

#include "context_impl.hpp"

namespace troupe::rref_detail {

namespace {

struct courier_state {
  control_retries ctl;
  std::map<std::string, std::vector<rref_msg::user_delete>> deletes;  // per owner, not sent yet
  bool armed = false;                                                 // the window timer runs
};
using courier_self = courier_actor::stateful_pointer<courier_state>;

void send_batch(courier_self self, context_impl& r, std::string to) {  // by value: the map's key is erased
  auto& s = self->state;
  auto it = s.deletes.find(to);
  if (it == s.deletes.end()) return;
  const auto n = static_cast<std::int64_t>(it->second.size());
  rref_msg::user_delete_batch batch{std::move(it->second)};
  s.deletes.erase(it);
  ++r.stats_.user_deletes;
  start_control(self, s.ctl, r, to, std::move(batch), {});  // counts itself in in_flight_
  r.in_flight_add(-n);  // the hand-overs' counts
}

// Passes the handed-over releases on to their forks. Takes the handed-over deletes into the
// per-owner batches and sends the full ones. When the window is over it sends all of them.
// With release_window 0, each delete goes in its own message. Otherwise the window timer runs:
// the router sends no handover_atom until it fired.
void collect(courier_self self, context_impl& r, bool window_over) {
  auto& s = self->state;
  const bool unbatched = r.opts_.release_window.count() <= 0;  // one message per delete, as before batching
  const bool all = window_over || unbatched;
  auto got = r.take_handover(all);
  for (const auto& rel : got.releases) rel.send();
  for (auto& d : got.deletes) {
    s.deletes[d.to].push_back(std::move(d.del));
    if (unbatched) send_batch(self, r, d.to);
  }
  std::vector<std::string> due;  // copies: send_batch erases the map's entry
  for (const auto& [to, batch] : s.deletes)
    if (all || batch.size() >= max_delete_batch) due.push_back(to);
  for (const auto& to : due) send_batch(self, r, to);
  if (all || s.armed) return;
  s.armed = true;
  self->delayed_send(self, r.opts_.release_window, flush_atom::value);
}

// Sweeps tombstones every ttl/2. Sends the child_acks of RRefs bound on their owner or refused on
// arrival, retried like every control message. Batches user_deletes (Note [release batching]).
courier_actor::behavior_type courier(courier_self self, std::shared_ptr<context_impl> r) {
  const auto period = std::max(r->opts_.tombstone_ttl / 2, std::chrono::milliseconds(1));
  self->delayed_send(self, period, sweep_atom::value);
  return {
      [self, r](courier_send& m) {
        start_control(self, self->state.ctl, *r, m.to, m.ack, {});
      },
      [self, r](handover_atom) { collect(self, *r, false); },
      [self, r](flush_atom) {
        self->state.armed = false;
        collect(self, *r, true);
      },
      [r](accepts_atom) { r->release_accepts(); },  // Note [withheld accept]
      [self, r, period](sweep_atom) {
        r->purge_tombstones();
        self->delayed_send(self, period, sweep_atom::value);
      },
      [self, r](rref_msg::control_done& d) { on_control_done(self, self->state.ctl, *r, d); },
      [self, r](rref_msg::retry_atom, std::uint64_t seq) { on_retry(self, self->state.ctl, *r, seq); },
  };
}

}  // namespace

courier_actor spawn_courier(context_impl& r) {
  logger_release release;
  return r.sys_->spawn(courier, r.shared_from_this());
}

}  // namespace troupe::rref_detail
