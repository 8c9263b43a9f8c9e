// The hierarchical group on 2 namespace hosts x 2 ranks:
// - make_cpu_group picks it;
// - DDP on it equals single-process training (<= 1e-6), bitwise identically on every rank;
// - a host cut off during an allreduce fails both survivors with peer_lost naming the host's
//   ranks within 2 s;
// - a cut of 200 ms loses no allreduce.
#include <sstream>

#include <catch2/catch.hpp>

#include "ddp/ddp_test_util.hpp"
#include "multihost/direct_ranks.hpp"
#include "multihost/rank_env.hpp"
#include "multihost/two_host_job.hpp"
#include "troupe/actors/host_address.hpp"
#include "troupe/ddp/hierarchical_group.hpp"

using namespace std::chrono_literals;
using namespace troupe;

namespace {

ddp::process_group_options group_options(const node_options& o) {
  ddp::process_group_options po;
  po.tcp_address = advertised_address(o.listen_addr, o.master_addr);  // this host's address
  po.timeout = 30s;
  return po;
}

// Waits (60 s at most) for the marks; shows every rank's output when they do not come.
void require_marks(const std::string& marks, const std::vector<std::string>& names, std::vector<test::host_process>& ranks) {
  const bool up = test::await_marks(marks, names, 60s);
  if (!up)
    for (std::size_t r = 0; r < ranks.size(); ++r) UNSCOPED_INFO("rank " << r << ":\n" << ranks[r].output());
  REQUIRE(up);
}

// Cuts host 1 while ranks 0, 1 wait in an allreduce of the rank program `tag`. Checks that both
// survivors failed with peer_lost within 2 s of the cut, and returns their error texts.
std::vector<std::string> survivors_lost(test::netns_bed& bed, const std::string& tag) {
  const auto marks = test::mark_dir(bed);
  auto ranks = test::start_direct_ranks(bed, tag);
  std::vector<std::string> texts;
  require_marks(marks, {"in-0", "in-1", "held-2", "held-3"}, ranks);
  const long long t_cut = bed.cut(1);  // the moment the cut went in
  for (int r = 0; r < 2; ++r) {
    CHECK(ranks[static_cast<std::size_t>(r)].wait(20s) == 0);
    const auto out = ranks[static_cast<std::size_t>(r)].output();
    INFO("rank " << r << ":\n" << out);
    const auto at = out.find("LOST ");
    REQUIRE(at != std::string::npos);
    std::istringstream in(out.substr(at + 5));
    long long at_ms = 0;
    int code = -1;
    in >> at_ms >> code;
    CHECK(code == static_cast<int>(errc::peer_lost));
    CHECK(at_ms - t_cut < 2000);
    texts.push_back(out.substr(at, out.find('\n', at) - at));
  }
  bed.heal(1);
  return texts;
}

}  // namespace

TEST_CASE("a hierarchical group across hosts trains ddp like a single process and bitwise identically on every rank",
          "[multihost][ddp][hierarchical]") {
  test::netns_bed bed(2);
  test::require_bed(bed);
  const auto r = test::run_two_host_job(bed, test::rank_program("[.mh_hier_rank]"));
  INFO(r.all());
  CHECK(r.codes == std::vector<int>{0, 0});
  for (const auto& out : r.outputs) CHECK_THAT(out, Catch::Contains("All tests passed") && !Catch::Contains("failed"));
}

TEST_CASE("a host cut off during a hierarchical allreduce fails both survivors with peer_lost naming its ranks within 2 s",
          "[multihost][partition][hierarchical]") {
  test::netns_bed bed(2);
  test::require_bed(bed);
  for (const auto& text : survivors_lost(bed, "[.mh_hier_cut_rank]")) CHECK_THAT(text, Catch::Contains("(ranks 2, 3)"));
}

TEST_CASE("a host cut off during a tcp ring allreduce fails both survivors with peer_lost within 2 s",
          "[multihost][partition]") {
  test::netns_bed bed(2);
  test::require_bed(bed);
  for (const auto& text : survivors_lost(bed, "[.mh_ring_cut_rank]"))
    CHECK_THAT(text, Catch::Contains("(worker2)") || Catch::Contains("(worker3)"));
}

// A cut shorter than the peer timeout during back-to-back allreduces: every allreduce completes
// with the exact sum on every rank.
TEST_CASE("a cut of 200 ms loses no hierarchical allreduce in flight or later", "[multihost][partition][hierarchical]") {
  test::netns_bed bed(2);
  test::require_bed(bed);
  const auto marks = test::mark_dir(bed);
  auto ranks = test::start_direct_ranks(bed, "[.mh_hier_blip_rank]");
  require_marks(marks, {"reducing-0"}, ranks);
  bed.blip(1, 200ms);
  test::set_mark(marks, "healed");
  for (auto& r : ranks) {
    const int code = r.wait(60s);
    INFO(r.output());
    CHECK(code == 0);
  }
}

// Hidden rank programs.

// One rank: make_cpu_group gives the hierarchical group. It runs 10 SGD steps of DDP on it,
// compared with one process on the 4 batches. Then it runs every reduce op on int and float
// tensors.
TEST_CASE("multihost hierarchical rank: train and compare", "[.mh_hier_rank]") {
  const auto o = test::rank_options();
  troupe::node n(o);
  const int me = n.info().rank;
  {
    auto group = ddp::make_cpu_group(n.store(), me, 4, "mh-hier", group_options(o));
    auto* hg = dynamic_cast<ddp::hierarchical_group*>(group.get());
    REQUIRE(hg != nullptr);
    CHECK(hg->hosts() == 2);
    CHECK(hg->host() == test::host_of(me));
    CHECK(hg->host_ranks() == std::vector<int>{2 * hg->host(), 2 * hg->host() + 1});
    auto model = test::make_mlp(static_cast<std::uint64_t>(me + 1));  // rank 0's init must win
    ddp::ddp_options opts;
    opts.bucket_cap_mb = 0.0005;  // several buckets
    ddp::distributed_data_parallel model_ddp(model, *group, opts);
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
    CHECK(test::same_on_all_ranks(hg->flat(), test::flat_params(*model)));

    // rank r holds r + 1 everywhere: sum 10, max 4, min 1, product 24, avg 2 (int: 10 / 4 -> 2).
    const std::pair<ddp::reduce_op, double> ops[] = {
        {ddp::reduce_op::sum, 10}, {ddp::reduce_op::max, 4}, {ddp::reduce_op::min, 1}, {ddp::reduce_op::product, 24}};
    for (auto [op, want] : ops) {
      tensor f = hg->make_buffer({1000}, dtype::float32);
      f.fill_(me + 1);
      group->allreduce(f, op).wait(20s);
      CHECK(f.data<float>()[0] == want);
      CHECK(f.data<float>()[999] == want);
    }
    tensor a = full({5}, me + 1, {dtype::float64});
    group->allreduce(a, ddp::reduce_op::avg).wait(20s);
    CHECK(a.data<double>()[4] == 2.5);
    tensor i = full({5}, me + 1, {dtype::int32});
    group->allreduce(i, ddp::reduce_op::avg).wait(20s);
    CHECK(i.data<std::int32_t>()[4] == 2);
  }
  test::finish_rank(n);
}

namespace {

// Ranks 0, 1 (host 0) mark in-<rank> and wait in an allreduce; ranks 2, 3 (host 1) mark
// held-<rank> and never issue it. A survivor prints "LOST <wall ms> <errc> <text>".
void cut_rank(bool hierarchical) {
  const std::string marks = test::rank_marks();
  const auto o = test::rank_options();
  troupe::node n(o);
  const int rank = n.info().rank;
  {
    auto po = group_options(o);
    po.transport = ddp::transport_kind::tcp;  // the flat group: one TCP ring through all ranks
    std::unique_ptr<ddp::collective_group> g;
    if (hierarchical) g = std::make_unique<ddp::hierarchical_group>(n.store(), rank, 4, "mh-hier-cut", po);
    else g = std::make_unique<ddp::process_group>(n.store(), rank, 4, "mh-ring-cut", po);
    if (rank < 2) {
      tensor t = g->make_buffer({1 << 16}, dtype::float32);
      auto w = g->allreduce(t);
      test::set_mark(marks, "in-" + std::to_string(rank));
      try {
        w.wait(20s);
        std::printf("NOT LOST\n");
      } catch (const troupe::error& e) {
        std::printf("LOST %lld %d %s\n", test::wall_ms(), static_cast<int>(e.code()), e.message().c_str());
      }
      std::fflush(stdout);
      // The other survivor must see host 1's loss, not this rank's exit.
      test::set_mark(marks, "done-" + std::to_string(rank));
      test::await_marks(marks, {"done-0", "done-1"}, 20s);
    } else {
      test::set_mark(marks, "held-" + std::to_string(rank));
      try {
        n.store().get("never set", 30s);  // fails once host 0 is gone
      } catch (const troupe::error&) {
      }
    }
  }
  n.shutdown(shutdown_mode::immediate);
}

}  // namespace

TEST_CASE("multihost hierarchical cut rank", "[.mh_hier_cut_rank]") { cut_rank(true); }
TEST_CASE("multihost ring cut rank", "[.mh_ring_cut_rank]") { cut_rank(false); }

// Every rank runs allreduces of 256 KiB until rank 0 saw the "healed" mark and 20 more; rank 0
// marks reducing-0 after 20. Rank 0's flag travels in the last element, so all ranks stop at
// the same allreduce. Every result must be exact.
TEST_CASE("multihost hierarchical blip rank", "[.mh_hier_blip_rank]") {
  const std::string marks = test::rank_marks();
  const auto o = test::rank_options();
  troupe::node n(o);
  const int rank = n.info().rank;
  {
    ddp::hierarchical_group hg(n.store(), rank, 4, "mh-hier-blip", group_options(o));
    int after_heal = -1;
    for (int i = 0; after_heal < 20; ++i) {
      REQUIRE(i < 5000);  // the test heals well before
      tensor t = hg.make_buffer({1 << 16}, dtype::float32);
      t.fill_(rank + i);
      const bool healed = rank == 0 && after_heal < 0 && i > 20 && test::has_mark(marks, "healed");
      t.data<float>()[(1 << 16) - 1] = healed ? 1.0f : 0.0f;
      hg.allreduce(t).wait(20s);
      REQUIRE(t.data<float>()[0] == static_cast<float>(6 + 4 * i));
      if (i == 20 && rank == 0) test::set_mark(marks, "reducing-0");
      if (after_heal >= 0) ++after_heal;
      else if (t.data<float>()[(1 << 16) - 1] != 0.0f) after_heal = 0;
    }
  }
  test::finish_rank(n);
}
