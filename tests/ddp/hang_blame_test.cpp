// Hang blame (Note [hang blame]) and the per-rank Chrome traces (TROUPE_TRACE), on spawned ranks.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "ddp/ddp_harness.hpp"
#include "troupe/actors/flight_recorder.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/loss.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/ddp/distributed_data_parallel.hpp"
#include "troupe/ddp/env_process_group.hpp"

using namespace troupe;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

/// A fresh directory for trace files, removed at scope exit.
struct temp_dir {
  fs::path path = fs::temp_directory_path() / ("troupe_blame_" + std::to_string(::getpid()) + "_" + std::to_string(std::rand()));
  temp_dir() { fs::create_directories(path); }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

/// True when python3 parses `file` as a Chrome trace. That is a traceEvents list whose complete
/// events all have ph, ts, dur, pid and tid. It holds at least one event of each name prefix in
/// `names`.
bool chrome_trace_holds(const fs::path& file, const std::vector<std::string>& names) {
  std::string list;
  for (const auto& n : names) list += (list.empty() ? "'" : ",'") + n + "'";
  const std::string script =
      "import json,sys\n"
      "d=json.load(open(sys.argv[1]))\n"
      "ev=[e for e in d['traceEvents'] if e['ph']=='X']\n"
      "assert all(all(k in e for k in ('ph','ts','dur','pid','tid')) for e in ev)\n"
      "assert all(any(e['name'].startswith(n) for e in ev) for n in [" + list + "]), [e['name'] for e in ev]\n";
  const fs::path py = file.string() + ".check.py";
  std::ofstream(py) << script;
  const int rc = std::system(("python3 " + py.string() + " " + file.string()).c_str());
  fs::remove(py);
  return rc == 0;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("ranks waiting for a rank that skipped an allreduce name it and the collective's number", "[ddp][blame]") {
  constexpr auto blame_after = 1000ms;
  constexpr auto bound = 3000ms;  // the report comes within blame_after + bound of entering
  test::temp_store dir;
  temp_dir traces;
  const ddp::file_store store = dir.store;
  const std::string trace_dir = traces.path.string();
  auto ctx = spawn(3, [store, trace_dir, blame_after, bound](int rank) {
    struct seen {
      std::mutex mu;
      std::string line;
      std::chrono::steady_clock::time_point at;
    };
    auto blamed = std::make_shared<seen>();
    ddp::process_group_options opts;
    opts.timeout = 8s;
    opts.blame_after = blame_after;
    opts.recorder = std::make_shared<flight_recorder>(64, trace_target{trace_dir, rank, "rank" + std::to_string(rank)});
    opts.on_blame = [blamed](const std::string& line) {
      std::lock_guard<std::mutex> lock(blamed->mu);
      if (blamed->line.empty()) blamed->at = std::chrono::steady_clock::now();
      blamed->line = line;
    };
    {
      ddp::process_group pg(store, rank, 3, "blame", opts);
      tensor t = ones({256});
      pg.allreduce(t).wait(20s);  // #1 on every rank
      if (rank == 2) {            // skips #2 and stays until the others are done
        store.get("skip/done0", 60s);
        store.get("skip/done1", 60s);
        return;
      }
      pg.note_next("bucket 0");
      const auto entered = std::chrono::steady_clock::now();
      ddp::work w = pg.allreduce(t);  // #2: rank 2 never enters it
      std::string err;
      try {
        w.wait(30s);
      } catch (const error& e) {
        err = e.message();
      }
      std::lock_guard<std::mutex> lock(blamed->mu);
      test::expect(has(blamed->line, "rank 2 never entered allreduce #2 (bucket 0); its last was #1"),
                   "the hang report names rank 2 and allreduce #2: '" + blamed->line + "'");
      test::expect(!has(blamed->line, "rank " + std::to_string(1 - rank) + " never"), "the other waiting rank is not blamed: '" + blamed->line + "'");
      test::expect(blamed->at - entered <= blame_after + bound, "the report came within blame_after + bound");
      test::expect(has(err, "rank 2 never entered allreduce #2"), "the collective's error names rank 2: '" + err + "'");
      store.set("skip/done" + std::to_string(rank), "1");
    }
  });
  REQUIRE(ctx.join(90s));
  // The two ranks whose collective failed wrote their traces, with the failed allreduce in them.
  for (int r = 0; r < 2; ++r) {
    const fs::path f = traces.path / ("trace-rank" + std::to_string(r) + ".json");
    REQUIRE(fs::exists(f));
    CHECK(chrome_trace_holds(f, {"allreduce #1", "allreduce #2"}));
  }
  CHECK_FALSE(fs::exists(traces.path / "trace-rank2.json"));
}

TEST_CASE("TROUPE_TRACE makes every rank write a chrome trace of its collectives and rpcs at shutdown", "[ddp][blame]") {
  const std::uint16_t port = troupe::test::free_port();
  temp_dir traces;
  const std::string trace_dir = traces.path.string();
  auto ctx = spawn(3, [port, trace_dir](int rank) {
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", "3", 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::setenv("TROUPE_JOB_TOKEN", "trace-test-token", 1);
    ::setenv("TROUPE_TRACE", trace_dir.c_str(), 1);
    ddp::env_process_group dist("tracetest");
    dist.node().functions().add("twice", [](int x) { return 2 * x; });
    tensor t = ones({64});
    dist.group().allreduce(t).wait(20s);  // every rank serves 'twice' from here on
    const std::string next = "worker" + std::to_string((rank + 1) % 3);
    test::expect(rpc_sync<int>(dist.node(), next, "twice", rank, 20s) == 2 * rank, "the rpc's result");
    dist.group().barrier().wait(20s);
    dist.shutdown(30s);
  });
  REQUIRE(ctx.join(90s));
  for (int r = 0; r < 3; ++r) {
    const fs::path f = traces.path / ("trace-rank" + std::to_string(r) + ".json");
    REQUIRE(fs::exists(f));
    CHECK(chrome_trace_holds(f, {"allreduce #1", "barrier #2", "twice #"}));
    std::ifstream in(f);
    std::stringstream ss;
    ss << in.rdbuf();
    CHECK(has(ss.str(), "\"cat\":\"rpc_call\""));
    CHECK(has(ss.str(), "\"cat\":\"rpc_serve\""));
  }
}

TEST_CASE("a ddp step records each bucket's allreduce with its bucket in the group's recorder", "[ddp][blame]") {
  test::temp_store dir;
  ddp::process_group_options opts;
  opts.recorder = std::make_shared<flight_recorder>(64);
  ddp::process_group pg(dir.store, 0, 1, "buckets", opts);
  generator g(3);
  auto model = std::make_shared<nn::linear>(8, 4, g);
  ddp::distributed_data_parallel d(model, pg);
  backward(nn::mse_loss(d(randn({2, 8}, g)), randn({2, 4}, g)));
  const auto ops = opts.recorder->last();
  CHECK(std::any_of(ops.begin(), ops.end(), [](const trace_entry& e) {
    return e.kind == trace_kind::collective && e.name == "allreduce" && e.detail == "bucket 0" && e.ended && e.ok;
  }));
}
