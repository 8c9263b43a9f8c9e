#pragma once
// The store actor (Note [store] in troupe/actors/store.hpp) and the client's private parts.

#include <memory>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "auth_set.hpp"

namespace troupe::detail {

/// Spawns the store; requests from nodes outside `auth` (and not local) are refused.
caf::actor spawn_store(caf::actor_system& sys, std::shared_ptr<auth_set> auth);

struct store_client_impl {
  caf::actor_system* sys = nullptr;
  caf::actor store;
};

}  // namespace troupe::detail
