// Stream order of DDP on CUDA (Note [DDP on CUDA] in grad_events.hpp).
#include "grad_events.hpp"

namespace troupe::ddp::detail {

#if defined(TROUPE_WITH_CUDA)

void grad_events::reset(troupe::device d, std::size_t n) {
  dev_ = d;
  events_.clear();
  if (!d.is_cuda()) return;
  events_.reserve(n);
  for (std::size_t i = 0; i < n; ++i) events_.emplace_back(d.index);
}

void grad_events::record(std::size_t i) {
  if (i < events_.size()) events_[i].record(cuda::current_stream(dev_.index));
}

void grad_events::wait(const std::vector<std::size_t>& params) const {
  if (events_.empty()) return;
  const auto s = cuda::current_stream(dev_.index);
  for (std::size_t i : params) events_[i].wait(s);
}

#else

void grad_events::reset(troupe::device d, std::size_t) { dev_ = d; }
void grad_events::record(std::size_t) {}
void grad_events::wait(const std::vector<std::size_t>&) const {}

#endif

}  // namespace troupe::ddp::detail
