// Shared-memory tensor transfer on one host (file_descriptor strategy). A 64 MB CPU tensor is
// copied into a fresh memfd segment (share_memory_). Its fd crosses to a child process over a
// Unix socket. The child maps it, copies it out into its own buffer and checks it, then acks.
// The limit is memcpy between two warm buffers in the same run.

#include <poll.h>
#include <sys/socket.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "bench_util.hpp"
#include "troupe/actors/shared_memory.hpp"
#include "troupe/actors/spawn.hpp"

namespace {

constexpr std::size_t bytes_64mb = 64u << 20;
constexpr std::size_t n_words = bytes_64mb / sizeof(std::int32_t);

// A 1-d int32 CPU tensor over a fresh private storage.
troupe::tensor int_tensor(std::size_t n) {
  auto impl = std::make_shared<troupe::tensor_impl>();
  impl->storage = troupe::storage::make(n * sizeof(std::int32_t), troupe::cpu_allocator());
  impl->sizes = {static_cast<std::int64_t>(n)};
  impl->strides = {1};
  impl->dtype = troupe::dtype::int32;
  return troupe::tensor(std::move(impl));
}

void fill(std::int32_t* p, std::int32_t marker) {
  for (std::size_t i = 0; i < n_words; ++i) p[i] = marker + static_cast<std::int32_t>(i & 0xff);
}

// Child: receive, copy out, check, ack — until the parent closes the socket.
void consumer(int /*rank*/, troupe::shm_channel& ch) {
  std::vector<std::int32_t> out(n_words);
  for (;;) {
    troupe::tensor t;
    try {
      t = ch.recv(std::chrono::seconds(60));
    } catch (const troupe::error&) {
      return;  // the parent is done
    }
    std::memcpy(out.data(), t.data_ptr(), bytes_64mb);
    const std::int32_t marker = out[0];
    const bool ok = out[n_words - 1] == marker + static_cast<std::int32_t>((n_words - 1) & 0xff);
    const char ack = ok ? 'k' : 'x';
    if (::send(ch.fd(), &ack, 1, MSG_NOSIGNAL) != 1) return;
  }
}

char wait_ack(int fd) {
  pollfd pfd{fd, POLLIN, 0};
  if (::poll(&pfd, 1, 60000) != 1) throw troupe::error(troupe::errc::timeout, "shm_bench: no ack within 60 s");
  char ack = 0;
  if (::recv(fd, &ack, 1, 0) != 1) throw troupe::error(troupe::errc::io_error, "shm_bench: consumer closed the socket");
  return ack;
}

}  // namespace

int main(int argc, char** argv) {
  troupe::bench::check_args(argc, argv, "shm_bench",
                            "A 64 MB tensor through shared memory to another process against memcpy.");
  const bool quick = troupe::bench::quick_mode(argc, argv);
  const int iters = quick ? 3 : 20;
  troupe::bench::report rep("shm");
  const std::string params = "\"bytes\": " + std::to_string(bytes_64mb) + ", \"iters\": " + std::to_string(iters);

  // The limit: memcpy between two warm private buffers.
  std::vector<std::int32_t> a(n_words, 1), b(n_words, 2);
  const auto memcpy_runs = troupe::bench::time_runs(2, iters, [&] { std::memcpy(b.data(), a.data(), bytes_64mb); });
  const double memcpy_s = troupe::bench::summarize(memcpy_runs).median;

  auto [mine, theirs] = troupe::shm_channel::make_pair();
  auto children = troupe::spawn(1, [&](int rank) {
    mine.close();  // so the parent's close reaches the child as EOF
    consumer(rank, theirs);
  });
  theirs.close();
  troupe::shm_provider provider("shmbench");
  troupe::tensor src = int_tensor(n_words);
  std::vector<double> copy_in, roundtrip;
  int bad = 0;
  for (int i = -2; i < iters; ++i) {  // two warm-up rounds
    troupe::tensor t = int_tensor(n_words);
    fill(t.data<std::int32_t>(), i * 1000);
    const auto t0 = troupe::bench::clock::now();
    troupe::share_memory_(t, provider);  // new memfd segment + copy-in
    const double in_s = troupe::bench::seconds_since(t0);
    mine.send(t);
    bad += wait_ack(mine.fd()) != 'k';
    const double rt_s = troupe::bench::seconds_since(t0);
    if (i >= 0) {
      copy_in.push_back(in_s);
      roundtrip.push_back(rt_s);
    }
  }
  mine.close();
  const bool joined = children.join(std::chrono::seconds(60));

  const auto in = troupe::bench::summarize(copy_in);
  const auto rt = troupe::bench::summarize(roundtrip);
  const double gb = static_cast<double>(bytes_64mb) / 1e9;
  rep.add("shm_64mb_copy_in_ms", in.median * 1e3, "ms", params);
  rep.add("shm_64mb_roundtrip_ms", rt.median * 1e3, "ms", params);
  rep.add("shm_64mb_roundtrip_p99_ms", rt.p99 * 1e3, "ms", params);
  rep.add("shm_64mb_roundtrip_gbps", gb / rt.median, "GB/s", params);
  rep.add("limit_memcpy_gbps", gb / memcpy_s, "GB/s", params);
  rep.add("shm_64mb_check_failures", bad + (joined ? 0 : 1), "count", params);
  rep.print_table();
  return bad == 0 && joined ? 0 : 1;
}
