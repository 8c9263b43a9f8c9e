// The CPU process group over the TCP ring (transport = tcp on loopback), against float64
// references on 1-4 spawned ranks; its failure rules; DDP over it against the shm path.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <sstream>

#include "ddp/ddp_test_util.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using ddp::reduce_op;

namespace {

ddp::process_group_options tcp_opts() {
  ddp::process_group_options o;
  o.transport = ddp::transport_kind::tcp;
  o.tcp_chunk_bytes = 16 << 10;  // small chunks: several pipelined chunks even for small tensors
  return o;
}

// Small integers: exact in every dtype and under every reduction for up to 4 ranks.
double value_of(int rank, std::int64_t i) { return static_cast<double>((i * 7 + rank * 13) % 9 - 4 + (i % 5 == 0 ? 0 : 1)); }

tensor make_input(int rank, std::int64_t n, dtype dt, std::int64_t shift = 0) {
  tensor d = empty({n}, {dtype::float64});
  for (std::int64_t i = 0; i < n; ++i) d.data<double>()[i] = value_of(rank, i + shift);
  return d.to(dt);
}

double reduce_ref(reduce_op op, int world, std::int64_t i, bool integral) {
  double acc = value_of(0, i);
  for (int k = 1; k < world; ++k) {
    const double v = value_of(k, i);
    if (op == reduce_op::sum || op == reduce_op::avg) acc += v;
    if (op == reduce_op::product) acc *= v;
    if (op == reduce_op::min) acc = std::min(acc, v);
    if (op == reduce_op::max) acc = std::max(acc, v);
  }
  if (op == reduce_op::avg) acc = integral ? std::trunc(acc / world) : acc / world;
  return acc;
}

void expect_close(const tensor& got, const std::function<double(std::int64_t)>& ref, const std::string& what) {
  const tensor d = got.to(dtype::float64);
  const double tol = got.dtype() == dtype::float16 ? 1e-3 : got.dtype() == dtype::float32 ? 1e-6 : 1e-12;
  for (std::int64_t i = 0; i < d.numel(); ++i) {
    const double r = ref(i), v = d.data<double>()[i];
    if (std::abs(v - r) > tol * std::max(1.0, std::abs(r)))
      test::expect(false, what + ": element " + std::to_string(i) + " is " + std::to_string(v) + ", expected " + std::to_string(r));
  }
}

void check_all(int rank, ddp::process_group& pg, std::int64_t n, dtype dt) {
  const int w = pg.world_size();
  const bool integral = !is_floating(dt);
  const std::string tag = std::string(to_string(dt)) + " n=" + std::to_string(n) + " w=" + std::to_string(w);
  for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max, reduce_op::product}) {
    tensor t = make_input(rank, n, dt);
    pg.allreduce(t, op).wait(20s);
    expect_close(t, [&](std::int64_t i) { return reduce_ref(op, w, i, integral); }, "allreduce " + std::string(ddp::to_string(op)) + " " + tag);
  }
  tensor b = make_input(rank, n, dt);
  pg.broadcast(b, w - 1).wait(20s);
  expect_close(b, [&](std::int64_t i) { return value_of(w - 1, i); }, "broadcast " + tag);
  tensor out = zeros({n * w}, {dt});
  pg.allgather(out, make_input(rank, n, dt)).wait(20s);
  expect_close(out, [&](std::int64_t i) { return value_of(static_cast<int>(i / std::max<std::int64_t>(n, 1)), i % std::max<std::int64_t>(n, 1)); },
               "allgather " + tag);
  tensor rs = zeros({n}, {dt});
  pg.reduce_scatter(rs, make_input(rank, n * w, dt), reduce_op::sum).wait(20s);
  expect_close(rs, [&](std::int64_t i) { return reduce_ref(reduce_op::sum, w, i + rank * n, integral); }, "reduce_scatter " + tag);
  pg.barrier().wait(20s);
}

}  // namespace

TEST_CASE("every collective over the tcp ring matches its reference on 1 to 4 ranks", "[ddp][process_group][tcp]") {
  const int world = GENERATE(1, 2, 3, 4);
  REQUIRE(test::run_group(world, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    for (dtype dt : {dtype::float32, dtype::float64, dtype::float16, dtype::int32})
      for (std::int64_t n : {0, 1, 7, 1000}) check_all(rank, pg, n, dt);
    check_all(rank, pg, 100'003, dtype::float32);  // ~25 chunks of 16 KiB per shard, odd shards
  }, tcp_opts()));
}

TEST_CASE("send and recv over tcp connect lazily and pass tensors around a ring", "[ddp][process_group][tcp]") {
  REQUIRE(test::run_group(3, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    const int w = pg.world_size(), src = (rank + w - 1) % w;
    tensor in = zeros({300'000}, {dtype::float64});  // 2.4 MB: more than the socket buffers take at once
    ddp::work s = pg.send(make_input(rank, 300'000, dtype::float64), (rank + 1) % w, 7);
    pg.recv(in, src, 7).wait(20s);
    s.wait(20s);
    expect_close(in, [&](std::int64_t i) { return value_of(src, i); }, "recv");
    tensor wrong = zeros({3}, {dtype::int32});  // a mismatched recv fails, the pair stays in step
    ddp::work s2 = pg.send(ones({5}), (rank + 1) % w, 1);
    bool failed = false;
    try {
      pg.recv(wrong, src, 1).wait(20s);
    } catch (const error& e) {
      failed = e.code() == errc::collective_mismatch;
    }
    s2.wait(20s);
    test::expect(failed, "a recv of the wrong dtype fails with collective_mismatch");
  }, tcp_opts()));
}

TEST_CASE("a tcp collective whose size differs on one rank fails with collective_mismatch on every rank", "[ddp][process_group][tcp]") {
  REQUIRE(test::run_group(3, [](int rank, const ddp::file_store&, ddp::process_group& pg) { test::expect_size_mismatch_reported(rank, pg); }, tcp_opts()));
}

TEST_CASE("a rank killed during a tcp allreduce makes the others fail with peer_lost naming it within 2 s", "[ddp][process_group][tcp][fault]") {
  auto probe = std::make_shared<test::peer_loss_probe>();
  test::temp_store dir;
  auto ctx = test::spawn_group(dir, 4, [probe](int rank, const ddp::file_store&, ddp::process_group& pg) {
    pg.barrier().wait(10s);
    tensor t = ones({4 << 20});
    ddp::work w = pg.allreduce(t);
    if (rank == 2) probe->kill_self();
    probe->report(rank, [&] { w.wait(10s); });
  }, tcp_opts());
  test::check_peer_lost(*probe, 3, 2, "tcp allreduce");
  REQUIRE_THROWS_AS(ctx.join(20s), error);
}

TEST_CASE("a connection with a wrong hello is refused and the tcp group still forms", "[ddp][process_group][tcp]") {
  test::temp_store dir;
  const ddp::file_store store = dir.store;
  auto rank1 = spawn(1, [store](int) {
    ddp::process_group pg(store, 1, 2, "test", tcp_opts());
    tensor t = full({10}, 2.0);
    pg.allreduce(t).wait(20s);
    test::expect(t.data<float>()[0] == 3.0f, "rank 1 sums");
  });
  // Before rank 0 exists, an intruder connects to rank 1 with a hello of the wrong nonce. Rank 1
  // published its port and waits for rank 0's key, so the connection waits in its backlog.
  std::istringstream in(store.get("troupe/pg/test/tcp/1", 20s));
  std::string host;
  int port = 0;
  in >> host >> port;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  char bogus[96] = {};
  std::memcpy(bogus, "\x48\x50\x52\x54\x01\x00\x00\x00", 8);  // right magic, ring kind, rank 0, nonce 0
  REQUIRE(::send(fd, bogus, sizeof(bogus), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(bogus)));
  // Rank 0 connects after the intruder, so rank 1 reads the bad hello first (accept is FIFO).
  ddp::process_group pg(store, 0, 2, "test", tcp_opts());
  tensor t = full({10}, 1.0);
  pg.allreduce(t).wait(20s);
  CHECK(t.data<float>()[0] == 3.0f);
  pollfd p{fd, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 10000) == 1);
  char c;
  CHECK(::recv(fd, &c, 1, 0) <= 0);  // closed by rank 1
  ::close(fd);
  REQUIRE(rank1.join(20s));
}

TEST_CASE("DDP over the tcp ring gives the same parameters as over shared memory, bitwise, on 2 ranks", "[ddp][tcp]") {
  test::temp_store dir;
  const ddp::file_store store = dir.store;
  auto ctx = spawn(2, [store](int rank) {
    auto train = [&](const std::string& name, ddp::transport_kind kind) {
      ddp::process_group_options o;
      o.transport = kind;
      ddp::process_group pg(store, rank, 2, name, o);
      auto model = test::make_mlp(static_cast<std::uint64_t>(rank + 1));
      ddp::ddp_options dopts;
      dopts.bucket_cap_mb = 0.0005;
      ddp::distributed_data_parallel ddp(model, pg, dopts);
      optim::sgd opt(ddp.parameters(), {.lr = 0.05});
      for (int step = 0; step < 10; ++step) {
        auto [x, y] = test::batch(step, rank);
        opt.zero_grad();
        backward(nn::mse_loss(ddp(x), y));
        opt.step();
      }
      return test::flat_params(*model);
    };
    const tensor a = train("shm", ddp::transport_kind::shared_memory);
    const tensor b = train("tcp", ddp::transport_kind::tcp);
    test::expect(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0,
                 "bitwise equal, max rel diff " + std::to_string(test::max_rel_diff(a, b)));
    test::check_child_leaks(rank);  // both transports, the reducer and autograd ran in this child
  });
  REQUIRE(ctx.join(60s));
}

TEST_CASE("the automatic transport picks shared memory when every rank is on this host", "[ddp][process_group][tcp]") {
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store& st, ddp::process_group& pg) {
    tensor t = full({10}, static_cast<double>(rank + 1));
    pg.allreduce(t).wait(10s);
    test::expect(t.data<float>()[0] == 3.0f, "the automatic group sums");
    bool tcp_published = true;
    try {
      st.get("troupe/pg/test/tcp/" + std::to_string(rank), 1ms);
    } catch (const error& e) {
      tcp_published = e.code() != errc::timeout;
    }
    test::expect(!tcp_published, "no rank published a TCP address (the shared-memory path was chosen)");
  }));
}

TEST_CASE("a tcp monitored barrier names the rank that did not arrive", "[ddp][process_group][tcp]") {
  REQUIRE(test::run_group(3, [](int rank, const ddp::file_store& st, ddp::process_group& pg) {
    test::expect_late_rank_named(rank, st, pg, "rank 2 did not arrive");
  }, tcp_opts()));
}

TEST_CASE("a tcp group refuses an address it cannot listen on or publish, at once", "[ddp][process_group][tcp]") {
  test::temp_store dir;
  for (const char* address : {"0.0.0.0", "no-such-host.invalid"}) {
    ddp::process_group_options o = tcp_opts();
    o.tcp_address = address;
    o.timeout = 2s;
    try {
      ddp::process_group pg(dir.store, 0, 1, "bad", o);
      FAIL("no error for tcp_address " << address);
    } catch (const error& e) {
      INFO(e.what());
      CHECK(e.code() == errc::bad_argument);
      CHECK(e.message().find(address) != std::string::npos);
    }
  }
}
