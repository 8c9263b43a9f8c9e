// The actor_training example runs, its loss falls, and a killed trainer is reported by the
// server and the evaluator while the others finish.
#include <cstdio>
#include <string>

#include <catch2/catch.hpp>

#ifdef TROUPE_ACTOR_TRAINING_PATH

namespace {

// The example's output and exit status, bounded by coreutils' timeout.
std::pair<std::string, int> run_example(const std::string& args) {
  const std::string cmd = "timeout 120 " + std::string(TROUPE_ACTOR_TRAINING_PATH) + " " + args + " 2>&1";
  std::FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  while (auto n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int status = ::pclose(p);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

}  // namespace

TEST_CASE("the actor_training example trains to a falling loss", "[actors][integration][example]") {
  auto [out, rc] = run_example("--trainers 2 --steps 60");
  INFO(out);
  CHECK(rc == 0);
  CHECK_THAT(out, Catch::Contains("the held-out loss fell"));
}

TEST_CASE("the actor_training example reports a killed trainer and finishes with the others", "[actors][integration][example]") {
  auto [out, rc] = run_example("--trainers 3 --steps 60 --kill-trainer-at 20");
  INFO(out);
  CHECK(rc == 0);
  CHECK_THAT(out, Catch::Contains("server: trainer on worker3 is down: worker worker3 was lost"));
  CHECK_THAT(out, Catch::Contains("evaluator: the trainer on worker3 is down: worker worker3 was lost"));
  CHECK_THAT(out, Catch::Contains("the held-out loss fell"));
}

TEST_CASE("the actor_training example explains itself with --help", "[actors][integration][example]") {
  auto [out, rc] = run_example("--help");
  CHECK(rc == 0);
  CHECK_THAT(out, Catch::Contains("--kill-trainer-at"));
}

#endif
