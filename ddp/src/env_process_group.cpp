// A process group from the launcher environment (env_process_group.hpp).
#include "troupe/ddp/env_process_group.hpp"

#include "troupe/ddp/node_faults.hpp"

namespace troupe::ddp {

env_process_group::env_process_group(std::string name, process_group_options opts)
    : env_process_group(node_options::from_env(), std::move(name), std::move(opts)) {}

env_process_group::env_process_group(node_options node, std::string name, process_group_options opts)
    : opts_(std::move(opts)), rank_(node.rank), world_size_(node.world_size) {
  if (node.rank < 0 || node.rank >= node.world_size)
    throw error(errc::bad_argument, "env_process_group: RANK " + std::to_string(node.rank) + " outside [0, WORLD_SIZE " +
                                        std::to_string(node.world_size) + ")");
  if (opts_.tcp_address == process_group_options{}.tcp_address) opts_.tcp_address = node.listen_addr;
  if (!opts_.tls.enabled()) opts_.tls = node.tls;
  node_ = std::make_unique<troupe::node>(std::move(node));
  if (!opts_.recorder) opts_.recorder = node_->shared_recorder();
  use_node_faults(*node_, opts_);
  group_ = make_cpu_group(node_->store(), rank_, world_size_, std::move(name), opts_);
  if (auto* h = dynamic_cast<hierarchical_group*>(group_.get())) flat_ = &h->flat();
  else flat_ = static_cast<process_group*>(group_.get());
}

env_process_group::~env_process_group() {
  group_.reset();
  node_.reset();  // immediate shutdown when shutdown() was not called
}

env_process_group::env_process_group(env_process_group&&) noexcept = default;
env_process_group& env_process_group::operator=(env_process_group&& o) noexcept {
  if (this == &o) return *this;
  group_.reset();  // the group before the node it met through
  node_ = std::move(o.node_);
  group_ = std::move(o.group_);
  flat_ = o.flat_;
  opts_ = std::move(o.opts_);
  rank_ = o.rank_;
  world_size_ = o.world_size_;
  return *this;
}

collective_group& env_process_group::collectives() {
  if (!group_) throw error(errc::invalid_state, "env_process_group::collectives() after shutdown");
  return *group_;
}

process_group& env_process_group::group() {
  if (!group_) throw error(errc::invalid_state, "env_process_group::group() after shutdown");
  return *flat_;
}

troupe::node& env_process_group::node() {
  if (!node_) throw error(errc::invalid_state, "env_process_group::node() after shutdown");
  return *node_;
}

std::optional<process_group> env_process_group::new_group(std::vector<int> ranks, process_group_options opts) {
  if (opts.tcp_address == process_group_options{}.tcp_address) opts.tcp_address = opts_.tcp_address;
  if (!opts.tls.enabled()) opts.tls = opts_.tls;
  if (!opts.recorder) opts.recorder = node().shared_recorder();
  if (!opts.fault_points) opts.fault_points = opts_.fault_points;
  if (!opts.payload_faults) opts.payload_faults = opts_.payload_faults;
  return group().new_group(node().store(), std::move(ranks), std::move(opts));
}

void env_process_group::shutdown(std::chrono::milliseconds timeout) {
  group_.reset();
  if (!node_) return;
  auto n = std::move(node_);
  n->shutdown(shutdown_mode::graceful, timeout);
}

}  // namespace troupe::ddp
