// Tests of ddp::checkpointer (Note [Job checkpoint]): the last complete checkpoint is restored,
// incomplete or damaged ones are skipped, old ones are pruned. Two spawned ranks over a file_store.
#include <catch2/catch.hpp>

#include <filesystem>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "ddp/ddp_test_util.hpp"
#include "troupe/ddp/checkpointer.hpp"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

void check(bool ok, const std::string& what) {
  if (!ok) throw error(errc::invalid_state, what);
}

/// A directory under the temp dir, removed at scope exit.
struct temp_dir {
  fs::path path = fs::temp_directory_path() / ("troupe_ckpt_" + std::to_string(::getpid()) + "_" +
                                              std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  temp_dir() { fs::create_directories(path); }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

/// One rank's training state, tracked by a checkpointer.
struct trainee {
  std::shared_ptr<nn::sequential> net = test::make_mlp(5);
  optim::sgd opt{net->parameters(), {.lr = 0.1, .momentum = 0.9}};
  generator gen{3};
  std::int64_t position = 0;

  void train(int step, int rank) {
    const auto [x, y] = test::batch(step, rank);
    opt.zero_grad();
    backward(nn::mse_loss(net->forward(x), y));
    opt.step();
    gen.reserve(1);
    position += 4;
  }
  void track(ddp::checkpointer& c) {
    c.track("net", *net);
    c.track("opt", opt);
    c.track("gen", gen);
    c.track("position", position);
  }
};

ddp::checkpointer_options options_for(const fs::path& dir, int keep = 3) {
  ddp::checkpointer_options o;
  o.dir = dir;
  o.every = 10;
  o.keep = keep;
  o.timeout = std::chrono::seconds(30);
  return o;
}

fs::path step_path(const fs::path& dir, int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  return dir / name;
}

// Rewrites the step line of `step`'s manifest to name `other`.
void rename_manifest_step(const fs::path& dir, int step, int other) {
  const auto path = step_path(dir, step) / "MANIFEST";
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string line = "step " + std::to_string(step) + "\n";
  const auto at = text.find(line);
  check(at != std::string::npos, "the manifest names its step");
  text.replace(at, line.size(), "step " + std::to_string(other) + "\n");
  std::ofstream(path, std::ios::trunc) << text;
}

// Flips one bit of `file` at `offset`.
void flip_byte(const fs::path& file, std::streamoff offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  const char c = static_cast<char>(f.get());
  f.seekp(offset);
  f.put(static_cast<char>(c ^ 0x10));
}

void truncate(const fs::path& file, std::uintmax_t size) { fs::resize_file(file, size); }

}  // namespace

TEST_CASE("a job checkpoint restores the model and optimizer and generator and position of its last complete step",
          "[ddp][checkpoint]") {
  temp_dir dir;
  REQUIRE(test::run_group(2, [&](int rank, const ddp::file_store&, ddp::process_group& pg) {
    trainee a;
    ddp::checkpointer ca(pg, options_for(dir.path));
    a.track(ca);
    check(ca.restore() == 0, "an empty directory restores nothing");
    for (int step = 1; step <= 20; ++step) {
      a.train(step, rank);
      ca.maybe_save(step);
    }
    const tensor params = test::flat_params(*a.net);
    const generator gen = a.gen;
    const std::int64_t position = a.position;
    a.train(21, rank);
    const tensor after = test::flat_params(*a.net);
    trainee b;  // a fresh process's state
    ddp::checkpointer cb(pg, options_for(dir.path));
    b.track(cb);
    check(cb.restore() == 20, "the newest complete step is 20");
    check(test::max_rel_diff(test::flat_params(*b.net), params) == 0, "parameters equal those of step 20");
    check(b.gen == gen && b.position == position, "generator and position equal those of step 20");
    b.train(21, rank);
    check(test::max_rel_diff(test::flat_params(*b.net), after) == 0,
          "the optimizer state resumes: step 21 equals the undisturbed step 21");
  }));
}

TEST_CASE("incomplete or torn or oversized checkpoints are skipped and the last complete one is loaded",
          "[ddp][checkpoint]") {
  temp_dir dir;
  REQUIRE(test::run_group(2, [&](int rank, const ddp::file_store&, ddp::process_group& pg) {
    trainee a;
    ddp::checkpointer ca(pg, options_for(dir.path, 20));
    a.track(ca);
    for (int step = 1; step <= 20; ++step) {
      a.train(step, rank);
      ca.maybe_save(step);
    }
    const tensor params = test::flat_params(*a.net);
    for (const int step : {30, 40, 50, 60, 70, 80, 90, 95}) {  // complete, then damaged below
      a.train(step, rank);
      ca.save(step);
    }
    if (rank == 0) {
      const fs::path& d = dir.path;
      fs::remove(step_path(d, 30) / "MANIFEST");                  // no manifest
      truncate(step_path(d, 40) / "MANIFEST", 45);                 // torn manifest
      truncate(step_path(d, 50) / "rank-1.part", 100);             // torn part
      rename_manifest_step(d, 60, 61);                             // a manifest of another step
      fs::remove(step_path(d, 70) / "rank-0.part");                // a part missing
      std::ofstream(step_path(d, 80) / "MANIFEST", std::ios::app) << std::string(1 << 20, 'x');  // past the bound
      flip_byte(step_path(d, 90) / "rank-0.part", 20);             // the part's header checksum
      flip_byte(step_path(d, 95) / "rank-1.part", 200);            // a payload byte
    }
    pg.barrier().wait(std::chrono::seconds(30));
    trainee b;
    ddp::checkpointer cb(pg, options_for(dir.path));
    b.track(cb);
    check(cb.restore() == 20, "every damaged step is skipped; step 20 is restored");
    check(test::max_rel_diff(test::flat_params(*b.net), params) == 0, "parameters equal those of step 20");
  }));
}

TEST_CASE("a checkpointer keeps only its newest complete checkpoints", "[ddp][checkpoint]") {
  temp_dir dir;
  REQUIRE(test::run_group(2, [&](int rank, const ddp::file_store&, ddp::process_group& pg) {
    trainee a;
    ddp::checkpointer ca(pg, options_for(dir.path, 2));
    a.track(ca);
    for (int step = 1; step <= 40; ++step) {
      a.train(step, rank);
      ca.maybe_save(step);
    }
  }));
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  CHECK(left == std::vector<std::string>{"step-00000030", "step-00000040"});
}

TEST_CASE("a checkpointer rejects an empty directory and non-positive intervals", "[ddp][checkpoint]") {
  test::temp_store store;
  ddp::process_group pg(store.store, 0, 1, "ckpt_options");
  ddp::checkpointer_options o;
  CHECK_THROWS_WITH(ddp::checkpointer(pg, o), Catch::Contains("directory is empty"));
  o.dir = "somewhere";
  o.every = 0;
  CHECK_THROWS_WITH(ddp::checkpointer(pg, o), Catch::Contains("every must be >= 1"));
  o.every = 1;
  o.keep = 0;
  CHECK_THROWS_WITH(ddp::checkpointer(pg, o), Catch::Contains("keep must be >= 1"));
}
