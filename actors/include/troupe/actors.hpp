#pragma once
/// \file actors.hpp
/// The runtime in one include. It holds nodes, their options and addresses, the rendezvous
/// store, RPC and its futures, and remote references. It also holds worker processes (spawn),
/// supervisors with their spawn service, and shared-memory tensors.
/// Link `troupe::actors`.

#include "troupe/actors/host_address.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/node_options.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/rpc/future.hpp"
#include "troupe/actors/rref/rref.hpp"
#include "troupe/actors/shared_memory.hpp"
#include "troupe/actors/spawn_service.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/actors/store.hpp"
#include "troupe/actors/supervisor.hpp"
#include "troupe/actors/worker_info.hpp"
#include "troupe/tensors.hpp"
