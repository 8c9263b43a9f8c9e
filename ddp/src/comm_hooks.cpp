// The built-in communication hooks of DDP: plain allreduce(avg) and 16-bit compression.
#include "troupe/ddp/distributed_data_parallel.hpp"

#include "troupe/tensors/autograd_hook.hpp"

namespace troupe::ddp {

namespace {

comm_hook compress_hook(troupe::dtype wire) {
  return [wire](collective_group& pg, grad_bucket& b) {
    no_grad_guard guard;
    // Divide first so the 16-bit sum cannot overflow where the average would not.
    tensor compressed = (b.buffer / static_cast<double>(pg.world_size())).to(wire);
    comm_result r;
    r.pending = pg.allreduce(compressed, reduce_op::sum);
    tensor buffer = b.buffer;
    r.then = [buffer, compressed]() mutable {
      no_grad_guard g;
      buffer.copy_(compressed);
    };
    return r;
  };
}

}  // namespace

comm_hook allreduce_hook() {
  return [](collective_group& pg, grad_bucket& b) { return comm_result{pg.allreduce(b.buffer, reduce_op::avg), nullptr}; };
}

comm_hook fp16_compress_hook() { return compress_hook(troupe::dtype::float16); }
comm_hook bf16_compress_hook() { return compress_hook(troupe::dtype::bfloat16); }

}  // namespace troupe::ddp
