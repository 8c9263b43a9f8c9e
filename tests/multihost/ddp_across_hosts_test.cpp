// DistributedDataParallel on 2 namespace hosts x 2 ranks. The process group picks TCP between
// hosts, since each host has its own identity. Parameters equal single-process training
// (<= 1e-6) and are bitwise identical on every rank.
#include <catch2/catch.hpp>

#include "ddp/ddp_test_util.hpp"
#include "multihost/rank_env.hpp"
#include "multihost/two_host_job.hpp"
#include "troupe/actors/host_address.hpp"

using namespace std::chrono_literals;
using namespace troupe;

TEST_CASE("ddp across hosts equals single-process training and is bitwise identical on every rank", "[multihost][ddp]") {
  test::netns_bed bed(2);
  test::require_bed(bed);
  const auto r = test::run_two_host_job(bed, test::rank_program("[.mh_ddp_rank]"));
  INFO(r.all());
  CHECK(r.codes == std::vector<int>{0, 0});
  for (const auto& out : r.outputs) CHECK_THAT(out, Catch::Contains("All tests passed") && !Catch::Contains("failed"));
}

// One rank (hidden): 10 SGD steps with DDP, compared with one process on the 4 batches.
TEST_CASE("multihost ddp rank: train and compare", "[.mh_ddp_rank]") {
  const auto o = test::rank_options();
  troupe::node n(o);
  const int me = n.info().rank;
  {
    ddp::process_group_options po;
    po.tcp_address = advertised_address(o.listen_addr, o.master_addr);  // this host's address
    po.timeout = 30s;
    ddp::process_group pg(n.store(), me, 4, "mh-ddp", po);
    // The hosts published different identities, so the group moves its bytes over TCP.
    CHECK(n.store().get("troupe/pg/mh-ddp/host/0", 10s) != n.store().get("troupe/pg/mh-ddp/host/2", 10s));
    auto model = test::make_mlp(static_cast<std::uint64_t>(me + 1));  // rank 0's init must win
    ddp::ddp_options opts;
    opts.bucket_cap_mb = 0.0005;  // several buckets
    ddp::distributed_data_parallel model_ddp(model, pg, opts);
    optim::sgd opt(model_ddp.parameters(), {.lr = 0.05});
    auto ref = test::make_mlp(1);
    optim::sgd ref_opt(ref->parameters(), {.lr = 0.05});
    for (int step = 0; step < 10; ++step) {
      auto [x, y] = test::batch(step, me);
      opt.zero_grad();
      backward(nn::mse_loss(model_ddp(x), y));
      opt.step();
      tensor_list xs, ys;
      for (int r = 0; r < 4; ++r) {
        auto [xr, yr] = test::batch(step, r);
        xs.push_back(xr);
        ys.push_back(yr);
      }
      ref_opt.zero_grad();
      backward(nn::mse_loss(ref->forward(cat(xs, 0)), cat(ys, 0)));
      ref_opt.step();
    }
    CHECK(test::max_rel_diff(test::flat_params(*model), test::flat_params(*ref)) <= 1e-6);
    CHECK(test::same_on_all_ranks(pg, test::flat_params(*model)));
  }
  test::finish_rank(n);
}
