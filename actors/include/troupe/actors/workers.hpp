#pragma once
/// \file workers.hpp
/// The workers of a job, like torch.distributed.rpc's worker list and get_worker_info(name).
/// Every node publishes its name under its rank in the store when it starts (node.hpp). So
/// these read the store. They block the calling thread, never an actor.

#include <chrono>
#include <string>
#include <vector>

#include "troupe/actors/worker_info.hpp"

namespace troupe {

class node;

/// Every worker of the job `n` belongs to, by rank. Blocks until every rank has started, up to
/// `timeout`; errc::timeout names the ranks not yet there. peer_lost when the store host is
/// gone, invalid_state after shutdown.
std::vector<worker_info> workers(node& n, std::chrono::milliseconds timeout);
/// workers(n, n.default_timeout()).
std::vector<worker_info> workers(node& n);

/// The worker named `name`. Reads the worker list as workers() does (same errors, same bound);
/// errc::bad_argument naming the job's workers when none is called `name`.
worker_info get_worker_info(node& n, const std::string& name, std::chrono::milliseconds timeout);
/// get_worker_info(n, name, n.default_timeout()).
worker_info get_worker_info(node& n, const std::string& name);

}  // namespace troupe
