#pragma once
// The fault plan of a node (TROUPE_FAULTS) applied to a process group that an example builds on
// that node, as env_process_group does for its own group (docs/faults.md).

#include <cstdint>
#include <string>

#include "troupe/actors.hpp"
#include "troupe/ddp.hpp"

namespace troupe::examples {

/// Passes the library's DDP and checkpoint fault points (forward, backward, allreduce,
/// allreduce_done, checkpoint) and the collective payload rules of `po`'s group to `n`'s fault
/// plan. Without a plan the points are no-ops and the payloads pay nothing. `n` must outlive the
/// group. Never blocks.
inline void use_node_faults(node& n, ddp::process_group_options& po) {
  po.fault_points = [&n](const std::string& point, std::int64_t step) { n.fault_point(point, step); };
  if (n.has_transport_hook()) po.payload_faults = [&n](envelope& msg) { return n.payload_fault(msg); };
}

}  // namespace troupe::examples
