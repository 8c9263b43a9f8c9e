// A node's fault plan on a process group (node_faults.hpp).
#include "troupe/ddp/node_faults.hpp"

namespace troupe::ddp {

void use_node_faults(node& n, process_group_options& opts) {
  if (!opts.fault_points) opts.fault_points = [&n](const std::string& point, std::int64_t step) { n.fault_point(point, step); };
  if (!opts.payload_faults && n.has_transport_hook()) opts.payload_faults = [&n](envelope& msg) { return n.payload_fault(msg); };
}

}  // namespace troupe::ddp
