// Uses every layer of an installed Troupe through the umbrella header: a gradient step on a
// linear layer, a safetensors round trip, an RPC from a one-node job to itself, and an
// all-reduce in a process group of one. Prints "consumer ok" and exits 0 when all agree.
#include <cstdio>
#include <filesystem>

#include <troupe/troupe.hpp>

using namespace troupe;

namespace {

double step_loss_drop(generator& g) {
  nn::linear layer(3, 1, g);
  optim::sgd opt(layer.parameters(), {.lr = 0.1});
  const tensor x = randn({16, 3}, g), y = x.sum({1}, true);
  auto loss = [&] { return nn::mse_loss(layer(x), y); };
  const double before = loss().item();
  backward(loss());
  opt.step();
  return before - loss().item();
}

}  // namespace

int main() {
  generator g(7);
  if (!(step_loss_drop(g) > 0)) return std::puts("a gradient step did not lower the loss"), 1;

  const auto path = std::filesystem::temp_directory_path() / "troupe_consumer.safetensors";
  save_safetensors({{"w", arange(6, dtype::float32).reshape({2, 3})}}, path.string());
  const double w_sum = load_safetensors(path.string()).at("w").sum().item();
  std::filesystem::remove(path);

  rpc::registry functions;
  functions.add("add", [](int a, int b) { return a + b; });
  node_options opts;
  opts.job_token = "consumer";
  node n(opts, functions);
  const int answer = rpc_sync<int>(n, "worker0", "add", 40, 2);
  double reduced = 0;
  {
    ddp::process_group group(n.store(), 0, 1, "consumer");
    tensor t = full({4}, 2.0);
    group.allreduce(t).wait();
    reduced = t.sum().item();
  }
  n.shutdown(shutdown_mode::graceful);
  if (w_sum != 15 || answer != 42 || reduced != 8) return std::puts("consumer: wrong results"), 1;
  std::puts("consumer ok");
  return 0;
}
