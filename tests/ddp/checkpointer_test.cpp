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

// Copies step 20's checkpoint as step `to`; its manifest names step `to` unless `keep_step`.
void copy_step(const fs::path& dir, int to, bool keep_step = false) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", to);
  fs::copy(dir / "step-00000020", dir / name, fs::copy_options::recursive);
  if (keep_step) return;
  std::ifstream in(dir / name / "MANIFEST");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto at = text.find("step 20\n");
  check(at != std::string::npos, "the manifest names step 20");
  text.replace(at, 8, "step " + std::to_string(to) + "\n");
  std::ofstream(dir / name / "MANIFEST", std::ios::trunc) << text;
}

void truncate(const fs::path& file, std::uintmax_t size) { fs::resize_file(file, size); }

}  // namespace

TEST_CASE("a job checkpoint restores the model, optimizer, generator and position of its last complete step",
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

TEST_CASE("incomplete, torn and oversized checkpoints are skipped and the last complete one is loaded",
          "[ddp][checkpoint]") {
  temp_dir dir;
  REQUIRE(test::run_group(2, [&](int rank, const ddp::file_store&, ddp::process_group& pg) {
    trainee a;
    ddp::checkpointer ca(pg, options_for(dir.path, 5));
    a.track(ca);
    for (int step = 1; step <= 20; ++step) {
      a.train(step, rank);
      ca.maybe_save(step);
    }
    const tensor params = test::flat_params(*a.net);
    if (rank == 0) {
      copy_step(dir.path, 30);  // no manifest
      fs::remove(dir.path / "step-00000030" / "MANIFEST");
      copy_step(dir.path, 40);  // torn manifest
      truncate(dir.path / "step-00000040" / "MANIFEST", 45);
      copy_step(dir.path, 50);  // torn part
      truncate(dir.path / "step-00000050" / "rank-1.part", 100);
      copy_step(dir.path, 60, true);  // a manifest of another step
      copy_step(dir.path, 70);  // a part missing
      fs::remove(dir.path / "step-00000070" / "rank-0.part");
      copy_step(dir.path, 80);  // a manifest past the read bound
      std::ofstream(dir.path / "step-00000080" / "MANIFEST", std::ios::app) << std::string(1 << 20, 'x');
      copy_step(dir.path, 90);  // a part of the right size with other bytes
      std::fstream part(dir.path / "step-00000090" / "rank-0.part", std::ios::in | std::ios::out | std::ios::binary);
      part.seekp(20);
      part.put('\x5a');
      copy_step(dir.path, 95);  // a part with a flipped payload byte
      std::fstream flip(dir.path / "step-00000095" / "rank-1.part", std::ios::in | std::ios::out | std::ios::binary);
      flip.seekg(200);
      const char c = static_cast<char>(flip.get());
      flip.seekp(200);
      flip.put(static_cast<char>(c ^ 0x10));
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
