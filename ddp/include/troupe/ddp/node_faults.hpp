#pragma once
/// \file node_faults.hpp
/// A node's fault plan applied to a process group built on that node (docs/faults.md).

#include "troupe/actors/node.hpp"
#include "troupe/ddp/process_group.hpp"

namespace troupe::ddp {

/// Sets the hooks of `opts` that are still unset to `n`'s fault plan (TROUPE_FAULTS). They are
/// the DDP and checkpoint points (`fault_points`) and the collective payload rules
/// (`payload_faults`, only when the node has a transport hook). Without a plan the points are
/// no-ops and payloads pay one branch. `n` must outlive every group built with `opts`. Never
/// blocks.
void use_node_faults(node& n, process_group_options& opts);

}  // namespace troupe::ddp
