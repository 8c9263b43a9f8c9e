// The members process_group adds as a collective_group (collective_group.hpp).
#include "troupe/ddp/process_group.hpp"

namespace troupe::ddp {

troupe::device process_group::device() const noexcept { return cpu_device; }

tensor process_group::make_buffer(shape_t shape, troupe::dtype dt) { return empty_shared(std::move(shape), dt); }

}  // namespace troupe::ddp
