// The NCCL process group in a build without NCCL: the type exists, constructing it says why it
// cannot work (nccl_process_group.hpp).
#include "troupe/ddp/nccl_process_group.hpp"

#if !defined(TROUPE_WITH_NCCL)

namespace troupe::ddp {

struct nccl_process_group::impl {};

namespace {
[[noreturn]] void no_nccl(const std::string& name) {
  throw troupe::error(errc::not_supported, "nccl_process_group '" + name +
                                               "': this build has no NCCL backend (configure with TROUPE_CUDA=ON and NCCL installed)");
}
}  // namespace

nccl_process_group::nccl_process_group(store_client&, int, int, std::string name, troupe::device, process_group_options) {
  no_nccl(name);
}
nccl_process_group::nccl_process_group(const file_store&, int, int, std::string name, troupe::device, process_group_options) {
  no_nccl(name);
}
nccl_process_group::~nccl_process_group() = default;
nccl_process_group::nccl_process_group(nccl_process_group&&) noexcept = default;
nccl_process_group& nccl_process_group::operator=(nccl_process_group&&) noexcept = default;
// No object can exist in this build, so the members below are unreachable.
int nccl_process_group::rank() const noexcept { return 0; }
int nccl_process_group::world_size() const noexcept { return 0; }
const std::string& nccl_process_group::name() const noexcept {
  static const std::string none;
  return none;
}
troupe::device nccl_process_group::device() const noexcept { return {}; }
work nccl_process_group::allreduce(tensor, reduce_op) { no_nccl(""); }
work nccl_process_group::broadcast(tensor, int) { no_nccl(""); }
work nccl_process_group::allgather(tensor, tensor) { no_nccl(""); }
work nccl_process_group::reduce_scatter(tensor, tensor, reduce_op) { no_nccl(""); }
work nccl_process_group::barrier() { no_nccl(""); }
work nccl_process_group::send(tensor, int) { no_nccl(""); }
work nccl_process_group::recv(tensor, int) { no_nccl(""); }
work nccl_process_group::batch_p2p(std::vector<p2p_op>) { no_nccl(""); }
void nccl_process_group::monitored_barrier(std::chrono::milliseconds) { no_nccl(""); }
tensor nccl_process_group::make_buffer(shape_t, troupe::dtype) { no_nccl(""); }
void nccl_process_group::note_next(std::string) {}
void nccl_process_group::abort(const std::string&) {}
std::optional<troupe::error> nccl_process_group::failure() const { return std::nullopt; }

}  // namespace troupe::ddp

#endif
