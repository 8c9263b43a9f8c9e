// Each lane of a process group keeps its own operation (ddp/src/lane_operation.hpp): a wait on
// one lane keeps its own name and deadline while another lane runs.

#include <catch2/catch.hpp>
#include <chrono>

#include "ddp/ddp_harness.hpp"
#include "ddp/ddp_test_util.hpp"
#include "troupe/tensors/factories.hpp"

using namespace troupe;
using namespace std::chrono_literals;

TEST_CASE("a recv that times out names itself, not the barrier that ran on the collective lane meanwhile", "[ddp][process_group]") {
  const auto transport = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  INFO("transport " << static_cast<int>(transport));
  ddp::process_group_options opts;
  opts.transport = transport;
  opts.timeout = 1500ms;  // the recv's deadline; also bounds the rendezvous
  opts.blame_after = 0ms;
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store& st, ddp::process_group& pg) {
    if (rank == 0) {
      tensor in = zeros({3});
      ddp::work r = pg.recv(in, 1, 5);  // rank 1 never sends
      pg.barrier().wait(20s);           // begins on the collective lane while the recv waits
      try {
        r.wait(20s);
        test::expect(false, "a recv completed without a send");
      } catch (const error& e) {
        test::expect(e.code() == errc::timeout, "timeout, got " + std::string(e.what()));
        test::expect(e.message().find("recv") != std::string::npos, "names the recv: " + e.message());
        test::expect(e.message().find("barrier") == std::string::npos, "does not name the barrier: " + e.message());
      }
      st.set("recv failed", "1");
    } else {
      pg.barrier().wait(20s);
      st.get("recv failed", 20s);  // stays in the group until rank 0's recv reached its deadline
    }
  }, opts));
}
