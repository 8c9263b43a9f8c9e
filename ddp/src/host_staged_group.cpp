// Collectives on CUDA tensors over a CPU group (Note [Host-staged collectives]).
#include "troupe/ddp/host_staged_group.hpp"

#include <mutex>

#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/factories.hpp"
#include "work_state.hpp"

namespace troupe::ddp {

namespace {

/// The copy back of one staged collective: done once, by the first thread that waits.
struct copy_back {
  std::mutex mu;
  bool copied = false;
  tensor out;
  tensor host;

  void run() {
    std::lock_guard<std::mutex> lock(mu);
    if (copied) return;
    no_grad_guard guard;
    out.copy_(host);  // on the waiting thread's current stream
    copied = true;
    host = tensor();
  }
};

}  // namespace

host_staged_group::host_staged_group(collective_group& inner, troupe::device dev) : inner_(inner), dev_(dev) {
  if (!inner.device().is_cpu())
    throw error(errc::device_mismatch, "host_staged_group: group '" + inner.name() + "' works on " +
                                           troupe::to_string(inner.device()) + ", not on host tensors");
  if (!dev.is_cuda())
    throw error(errc::device_mismatch, "host_staged_group: the device must be a CUDA device, got " + troupe::to_string(dev));
}

tensor host_staged_group::stage_in(const tensor& t, const char* what) const {
  if (!t.defined()) throw error(errc::bad_argument, std::string("host_staged_group::") + what + ": undefined tensor");
  if (t.device() != dev_ || !t.is_contiguous())
    throw error(errc::device_mismatch, std::string("host_staged_group::") + what + ": expected a contiguous " +
                                           troupe::to_string(dev_) + " tensor, got " +
                                           (t.is_contiguous() ? "" : "a non-contiguous ") + troupe::to_string(t.device()));
  no_grad_guard guard;
  tensor host = empty(t.shape(), {t.dtype(), cpu_device});
  host.copy_(t);  // waits for the caller's current stream
  return host;
}

work host_staged_group::staged(work cpu_work, tensor out, tensor host) {
  auto back = std::make_shared<copy_back>();
  back->out = std::move(out);
  back->host = std::move(host);
  auto s = std::make_shared<work::state>();
  s->description = cpu_work.description();
  s->device = work::state::device_completion{
      [cpu_work, back](std::chrono::milliseconds t) {
        cpu_work.wait(t);
        back->run();
      },
      [cpu_work] { return cpu_work.is_completed(); },
      [cpu_work] { return cpu_work.error(); },
      [cpu_work, back] {
        cpu_work.wait();
        back->run();
      }};
  return work(std::move(s));
}

work host_staged_group::allreduce(tensor t, reduce_op op) {
  tensor h = stage_in(t, "allreduce");
  return staged(inner_.allreduce(h, op), std::move(t), h);
}

work host_staged_group::broadcast(tensor t, int root) {
  tensor h = stage_in(t, "broadcast");
  return staged(inner_.broadcast(h, root), std::move(t), h);
}

work host_staged_group::allgather(tensor output, tensor input) {
  tensor hi = stage_in(input, "allgather");
  tensor ho = stage_in(output, "allgather");
  return staged(inner_.allgather(ho, hi), std::move(output), ho);
}

work host_staged_group::reduce_scatter(tensor output, tensor input, reduce_op op) {
  tensor hi = stage_in(input, "reduce_scatter");
  tensor ho = stage_in(output, "reduce_scatter");
  return staged(inner_.reduce_scatter(ho, hi, op), std::move(output), ho);
}

tensor host_staged_group::make_buffer(shape_t shape, troupe::dtype dt) {
  for (auto d : shape)
    if (d < 0) throw error(errc::bad_argument, "host_staged_group::make_buffer: negative size " + shape_to_string(shape));
  return zeros(std::move(shape), {dt, dev_});
}

}  // namespace troupe::ddp
