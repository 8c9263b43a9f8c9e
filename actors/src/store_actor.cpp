// The store actor: state and behaviour (Note [store]).
#include "store_actor.hpp"

#include <chrono>
#include <cstdio>
#include <map>
#include <set>

#include <caf/all.hpp>

#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/messages.hpp"

namespace troupe::detail {

namespace {

struct waiter {
  std::vector<std::string> keys;
  bool want_value = false;  // get (value of keys[0]) or wait (unit)
  caf::typed_response_promise<std::string> promise;
};

struct barrier_entry {
  std::int32_t world_size = 0;
  std::uint64_t generation = 0;
  std::set<std::int32_t> arrived;
  std::vector<caf::typed_response_promise<void>> promises;
};

struct store_state {
  std::shared_ptr<auth_set> auth;
  std::map<std::string, std::string> kv;
  std::map<std::uint64_t, waiter> waiters;
  std::map<std::string, barrier_entry> barriers;
  std::uint64_t next_id = 1;
};

using store_self = store_handle::stateful_pointer<store_state>;

bool authorized(store_self self) {
  const auto& s = self->current_sender();
  if (s && (s->node() == self->node() || self->state.auth->contains(s->node()))) return true;
  std::fprintf(stderr, "[troupe] store: refused a request from unauthenticated node %s\n",
               s ? caf::to_string(s->node()).c_str() : "<anonymous>");
  return false;
}

caf::error refused() { return to_caf_error(errc::unauthorized, "store: the caller never presented the job token"); }

bool all_present(store_state& s, const std::vector<std::string>& keys) {
  for (const auto& k : keys)
    if (!s.kv.count(k)) return false;
  return true;
}

void wake(store_self self) {
  auto& s = self->state;
  for (auto it = s.waiters.begin(); it != s.waiters.end();) {
    if (all_present(s, it->second.keys)) {
      if (it->second.want_value) it->second.promise.deliver(s.kv[it->second.keys[0]]);
      else it->second.promise.deliver(std::string());
      it = s.waiters.erase(it);
    } else {
      ++it;
    }
  }
}

caf::result<std::string> park(store_self self, std::vector<std::string> keys, bool want_value, std::int64_t timeout_ms) {
  auto& s = self->state;
  const auto id = s.next_id++;
  auto rp = self->make_response_promise<std::string>();
  s.waiters.emplace(id, waiter{std::move(keys), want_value, rp});
  self->delayed_send(self, std::chrono::milliseconds(timeout_ms), store_expire_atom::value, id);
  return caf::delegated<std::string>();
}

void expire(store_self self, std::uint64_t id) {
  auto& s = self->state;
  auto it = s.waiters.find(id);
  if (it == s.waiters.end()) return;
  std::string missing;
  for (const auto& k : it->second.keys)
    if (!s.kv.count(k)) missing += (missing.empty() ? "" : ", ") + k;
  it->second.promise.deliver(to_caf_error(errc::timeout, "store: timed out waiting for key(s) " + missing));
  s.waiters.erase(it);
}

caf::result<void> arrive(store_self self, store_barrier& b) {
  auto& s = self->state;
  auto& e = s.barriers[b.name];
  if (e.promises.empty()) {
    e.world_size = b.world_size;
    e.generation = s.next_id++;
  }
  if (b.world_size != e.world_size)
    return to_caf_error(errc::bad_argument, "store barrier '" + b.name + "': rank " + std::to_string(b.rank) + " says world size " +
                                                std::to_string(b.world_size) + ", others " + std::to_string(e.world_size));
  e.arrived.insert(b.rank);
  e.promises.push_back(self->make_response_promise<void>());
  if (static_cast<std::int32_t>(e.arrived.size()) >= e.world_size) {
    for (auto& p : e.promises) static_cast<caf::response_promise&>(p).deliver(caf::unit);  // typed<void> has no deliver()
    s.barriers.erase(b.name);
  } else {
    self->delayed_send(self, std::chrono::milliseconds(b.timeout_ms), store_bexpire_atom::value, b.name, e.generation);
  }
  return caf::delegated<void>();
}

void barrier_expire(store_self self, const std::string& name, std::uint64_t generation) {
  auto& s = self->state;
  auto it = s.barriers.find(name);
  if (it == s.barriers.end() || it->second.generation != generation) return;
  std::string missing;
  for (std::int32_t r = 0; r < it->second.world_size; ++r)
    if (!it->second.arrived.count(r)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
  const auto err = to_caf_error(errc::timeout, "store barrier '" + name + "' timed out; ranks that did not arrive: " + missing);
  for (auto& p : it->second.promises) p.deliver(err);
  s.barriers.erase(it);
}

caf::result<std::int64_t> add(store_self self, store_add& m) {
  auto& v = self->state.kv[m.key];
  std::int64_t cur = 0;
  if (!v.empty()) {
    std::size_t used = 0;
    try {
      cur = std::stoll(v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v.size()) return to_caf_error(errc::bad_argument, "store add: key '" + m.key + "' does not hold an integer");
  }
  cur += m.delta;
  v = std::to_string(cur);
  wake(self);
  return cur;
}

store_handle::behavior_type store(store_self self, std::shared_ptr<auth_set> auth) {
  self->state.auth = std::move(auth);
  return {
      [=](store_set& m) -> caf::result<void> {
        if (!authorized(self)) return refused();
        self->state.kv[m.key] = std::move(m.value);
        wake(self);
        return caf::unit;
      },
      [=](store_get& m) -> caf::result<std::string> {
        if (!authorized(self)) return refused();
        auto it = self->state.kv.find(m.key);
        if (it != self->state.kv.end()) return it->second;
        return park(self, {m.key}, true, m.timeout_ms);
      },
      [=](store_wait& m) -> caf::result<std::string> {
        if (!authorized(self)) return refused();
        if (all_present(self->state, m.keys)) return std::string();
        return park(self, std::move(m.keys), false, m.timeout_ms);
      },
      [=](store_add& m) -> caf::result<std::int64_t> {
        if (!authorized(self)) return refused();
        return add(self, m);
      },
      [=](store_cas& m) -> caf::result<std::string> {
        if (!authorized(self)) return refused();
        auto it = self->state.kv.find(m.key);
        const std::string cur = it == self->state.kv.end() ? std::string() : it->second;
        if (cur != m.expected) return cur;
        self->state.kv[m.key] = m.desired;
        wake(self);
        return m.desired;
      },
      [=](store_erase& m) -> caf::result<bool> {
        if (!authorized(self)) return refused();
        return self->state.kv.erase(m.key) > 0;
      },
      [=](store_num_keys&) -> caf::result<std::int64_t> {
        if (!authorized(self)) return refused();
        return static_cast<std::int64_t>(self->state.kv.size());
      },
      [=](store_barrier& m) -> caf::result<void> {
        if (!authorized(self)) return refused();
        return arrive(self, m);
      },
      // Timers come only from the store itself; anything else (a remote node sending the atom)
      // is ignored so it cannot expire someone's wait early.
      [=](store_expire_atom, std::uint64_t id) {
        if (self->current_sender() == self->ctrl()) expire(self, id);
      },
      [=](store_bexpire_atom, const std::string& name, std::uint64_t gen) {
        if (self->current_sender() == self->ctrl()) barrier_expire(self, name, gen);
      },
  };
}

}  // namespace

caf::actor spawn_store(caf::actor_system& sys, std::shared_ptr<auth_set> auth) {
  return caf::actor_cast<caf::actor>(sys.spawn(store, std::move(auth)));
}

}  // namespace troupe::detail
