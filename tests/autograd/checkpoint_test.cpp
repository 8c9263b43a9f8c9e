// Checkpoints: exact resume, corruption and truncation detection, crash safety while saving.
#include <catch2/catch.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <unistd.h>

#include "troupe/autograd/checkpoint.hpp"
#include "troupe/autograd/nn/activation.hpp"
#include "troupe/autograd/nn/dropout.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/loss.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/autograd/optim/adam.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/serialization.hpp"

using namespace troupe;
namespace fs = std::filesystem;

namespace {

// A fresh directory removed with everything in it when the test ends.
struct temp_dir {
  fs::path path;
  temp_dir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("troupe-ckpt-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A model, its optimizer and the generator that drives data and dropout: the whole training
// state a checkpoint has to capture.
struct trainer {
  generator gen;
  nn::sequential model;
  std::unique_ptr<optim::adamw> opt;

  explicit trainer(std::uint64_t seed) : gen(seed) {
    model.push_back(std::make_shared<nn::linear>(3, 8, gen));
    model.push_back(std::make_shared<nn::relu>());
    model.push_back(std::make_shared<nn::dropout>(0.2, gen));
    model.push_back(std::make_shared<nn::linear>(8, 2, gen));
    opt = std::make_unique<optim::adamw>(model.parameters(), optim::adam_options{.lr = 0.01, .weight_decay = 0.05});
  }

  // One step on a batch drawn from the generator (so its state matters for the continuation).
  void step() {
    const tensor x = randn({16, 3}, gen);
    const tensor y = randint(0, 2, {16}, gen);
    opt->zero_grad();
    backward(nn::cross_entropy_loss(model.forward(x), y));
    opt->step();
  }
};

void require_same_parameters(const nn::module& a, const nn::module& b) {
  const auto pa = a.parameters(), pb = b.parameters();
  REQUIRE(pa.size() == pb.size());
  for (std::size_t i = 0; i < pa.size(); ++i) CHECK(equal(pa[i], pb[i]));
}

bool is_corrupt(const error& e) { return e.code() == errc::checkpoint_corrupt; }

}  // namespace

TEST_CASE("save, load and continue gives bit-identical parameters to an uninterrupted run", "[autograd][checkpoint]") {
  temp_dir dir;
  const auto path = dir.file("run.ckpt");
  trainer straight(7);
  for (int s = 0; s < 6; ++s) straight.step();

  trainer first_half(7);
  for (int s = 0; s < 3; ++s) first_half.step();
  save_checkpoint(path, first_half.model, *first_half.opt, 3, first_half.gen);

  trainer resumed(99);  // different initial weights and generator: everything must come from the file
  CHECK_FALSE(equal(resumed.model.parameters()[0], first_half.model.parameters()[0]));
  const std::int64_t step = load_checkpoint(path, resumed.model, *resumed.opt, resumed.gen);
  CHECK(step == 3);
  CHECK(resumed.gen == first_half.gen);
  for (int s = 3; s < 6; ++s) resumed.step();
  require_same_parameters(resumed.model, straight.model);
  CHECK(resumed.opt->state(0).step == 6);
}

TEST_CASE("every truncation of a checkpoint is rejected as corrupt", "[autograd][checkpoint]") {
  temp_dir dir;
  trainer t(1);
  t.step();
  const auto path = dir.file("a.ckpt");
  save_checkpoint(path, t.model, *t.opt, 1, t.gen);
  const std::string bytes = read_all(path);
  trainer target(2);
  const tensor before = target.model.parameters()[0].clone();
  for (std::size_t len : {std::size_t{0}, std::size_t{5}, std::size_t{27}, std::size_t{28}, bytes.size() / 2,
                          bytes.size() - 1}) {
    INFO("truncated to " << len << " of " << bytes.size() << " bytes");
    write_all(dir.file("cut.ckpt"), bytes.substr(0, len));
    CHECK_THROWS_MATCHES(load_checkpoint(dir.file("cut.ckpt"), target.model, *target.opt, target.gen), error,
                         Catch::Predicate<error>(is_corrupt));
  }
  CHECK(equal(target.model.parameters()[0], before));  // nothing half-loaded
}

TEST_CASE("a flipped bit anywhere in a checkpoint is detected", "[autograd][checkpoint]") {
  trainer t(3);
  checkpoint_state st{t.model.state_dict(), t.opt->state_dict(), 11, t.gen};
  const std::string bytes = encode_checkpoint(st);
  const auto decoded = decode_checkpoint(bytes, "mem");
  CHECK(decoded.step == 11);
  CHECK(equal(decoded.model.at("0.weight"), t.model.parameters()[0]));
  // Header fields (magic, version, length, checksum) and payload positions.
  for (std::size_t pos : {std::size_t{0}, std::size_t{9}, std::size_t{14}, std::size_t{22}, std::size_t{40},
                          bytes.size() / 2, bytes.size() - 1}) {
    std::string bad = bytes;
    bad[pos] = static_cast<char>(bad[pos] ^ 0x10);
    INFO("flipped byte " << pos);
    CHECK_THROWS_MATCHES(decode_checkpoint(bad, "mem"), error, Catch::Predicate<error>([](const error& e) {
                           return e.code() == errc::checkpoint_corrupt && e.message().rfind("mem: ", 0) == 0;
                         }));
  }
}

TEST_CASE("a save that fails midway leaves the previous checkpoint loadable", "[autograd][checkpoint]") {
  temp_dir dir;
  const auto path = dir.file("keep.ckpt");
  trainer t(4);
  t.step();
  save_checkpoint(path, t.model, *t.opt, 1, t.gen);
  const tensor saved_w = t.model.parameters()[0].clone();
  t.step();
  // The writer streams half of the new checkpoint and then dies, as a crash mid-save would.
  const std::string next = encode_checkpoint({t.model.state_dict(), t.opt->state_dict(), 2, t.gen});
  CHECK_THROWS(atomic_write_file(path, [&](std::ostream& os) {
    os.write(next.data(), static_cast<std::streamsize>(next.size() / 2));
    throw std::runtime_error("simulated crash while saving");
  }));
  trainer restored(5);
  CHECK(load_checkpoint(path, restored.model, *restored.opt, restored.gen) == 1);
  CHECK(equal(restored.model.parameters()[0], saved_w));
  // No temporary is left beside it.
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);
  // Saving into a missing directory is an io_error, not a crash.
  CHECK_THROWS_MATCHES(save_checkpoint(dir.file("missing/x.ckpt"), t.model, *t.opt, 2, t.gen), error,
                       Catch::Predicate<error>([](const error& e) { return e.code() == errc::io_error; }));
}

TEST_CASE("loading a checkpoint into a different model names the offending key", "[autograd][checkpoint]") {
  temp_dir dir;
  const auto path = dir.file("m.ckpt");
  trainer t(6);
  save_checkpoint(path, t.model, *t.opt, 0, t.gen);
  generator gen(1);
  nn::sequential other(std::make_shared<nn::linear>(3, 9, gen));
  optim::adam opt(other.parameters());
  CHECK_THROWS_MATCHES(load_checkpoint(path, other, opt, gen), error, Catch::Predicate<error>([](const error& e) {
                         return e.code() == errc::shape_mismatch && e.message().find("0.weight") != std::string::npos;
                       }));
  CHECK_THROWS_MATCHES(load_checkpoint(dir.file("none.ckpt"), other, opt, gen), error,
                       Catch::Predicate<error>([](const error& e) { return e.code() == errc::io_error; }));
}

TEST_CASE("a checkpoint whose optimizer state does not fit leaves the model untouched", "[autograd][checkpoint]") {
  temp_dir dir;
  const auto path = dir.file("sgd.ckpt");
  generator gen(8);
  nn::linear lin(2, 2, gen);
  optim::sgd sgd_opt(lin.parameters(), {.lr = 0.1, .momentum = 0.9});
  save_checkpoint(path, lin, sgd_opt, 1, gen);
  generator other_gen(9);
  nn::linear other(2, 2, other_gen);
  optim::adam adam_opt(other.parameters());
  const tensor before = other.weight.clone();
  const generator gen_before = other_gen;
  // sgd's hyperparameters (momentum, nesterov, ...) are unexpected keys for adam.
  CHECK_THROWS_MATCHES(load_checkpoint(path, other, adam_opt, other_gen), error,
                       Catch::Predicate<error>([](const error& e) { return e.code() == errc::bad_argument; }));
  CHECK(equal(other.weight, before));
  CHECK(other_gen == gen_before);
}
