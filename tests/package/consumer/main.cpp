// hello_ddp: Linear(4, 1) learns y = x0 + x1 + x2 + x3 with DistributedDataParallel.
// Run: troupe-run --nproc-per-node 2 -- ./hello_ddp   (started alone, it is a job of one rank)
#include <cstdio>

#include <troupe/troupe.hpp>

using namespace troupe;

int main() {
  node n(node_options::from_env());  // RANK, WORLD_SIZE, MASTER_ADDR, ... set by troupe-run
  const int rank = n.info().rank, world = n.info().world_size;
  generator gen(rank);  // each rank draws its own data; DDP starts every rank from rank 0's weights
  double loss_now = 0;
  {
    ddp::process_group group(n.store(), rank, world, "hello");
    ddp::distributed_data_parallel model(std::make_shared<nn::linear>(4, 1, gen), group);
    optim::sgd opt(model.parameters(), {.lr = 0.1});
    for (int step = 1; step <= 200; ++step) {
      const tensor x = randn({16, 4}, gen), y = x.sum({1}, true);  // learn y = x0 + x1 + x2 + x3
      opt.zero_grad();
      const tensor loss = nn::mse_loss(model(x), y);
      backward(loss);  // the gradients are averaged over the ranks here
      opt.step();
      loss_now = loss.item();
      if (rank == 0 && (step == 1 || step % 50 == 0)) std::printf("step %d  loss %.3g\n", step, loss_now);
    }
  }
  n.shutdown(shutdown_mode::graceful);
  return loss_now < 1e-3 ? 0 : 1;
}
