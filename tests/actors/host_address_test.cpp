// Addresses a node binds and publishes (Note [listen and advertise]) and the launcher variables
// node_options::from_env() reads, Slurm's included.
#include <cstdlib>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "troupe/actors/host_address.hpp"
#include "troupe/actors/node_options.hpp"
#include "troupe/tensors/error.hpp"

namespace {

// Sets environment variables for a scope and restores the previous values after it.
class env_scope {
 public:
  explicit env_scope(const std::map<std::string, std::optional<std::string>>& vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_[k] = old ? std::optional<std::string>(old) : std::nullopt;
      if (v) ::setenv(k.c_str(), v->c_str(), 1);
      else ::unsetenv(k.c_str());
    }
  }
  ~env_scope() {
    for (const auto& [k, v] : saved_) {
      if (v) ::setenv(k.c_str(), v->c_str(), 1);
      else ::unsetenv(k.c_str());
    }
  }
  env_scope(const env_scope&) = delete;
  env_scope& operator=(const env_scope&) = delete;

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

const std::map<std::string, std::optional<std::string>> no_launcher{
    {"RANK", std::nullopt},        {"WORLD_SIZE", std::nullopt},         {"LOCAL_RANK", std::nullopt},
    {"MASTER_ADDR", std::nullopt}, {"MASTER_PORT", std::nullopt},        {"TROUPE_LISTEN_ADDR", std::nullopt},
    {"SLURM_PROCID", std::nullopt}, {"SLURM_NTASKS", std::nullopt},      {"SLURM_LOCALID", std::nullopt},
    {"SLURM_JOB_NODELIST", std::nullopt}, {"SLURM_JOB_ID", std::nullopt}};

// no_launcher with `set` applied.
std::map<std::string, std::optional<std::string>> launcher_env(const std::vector<std::pair<std::string, std::string>>& set) {
  auto vars = no_launcher;
  for (const auto& [k, v] : set) vars.insert_or_assign(k, std::optional<std::string>(std::in_place, v));
  return vars;
}

}  // namespace

TEST_CASE("the address that routes to loopback is loopback, and a wildcard bind publishes it", "[actors][address]") {
  CHECK(troupe::routable_address("127.0.0.1") == "127.0.0.1");
  CHECK(troupe::advertised_address("0.0.0.0", "127.0.0.1") == "127.0.0.1");
  CHECK(troupe::advertised_address("10.1.2.3", "127.0.0.1") == "10.1.2.3");
  CHECK(troupe::is_wildcard_address("0.0.0.0"));
  CHECK_FALSE(troupe::is_wildcard_address("127.0.0.1"));
  CHECK(troupe::is_loopback_address("127.0.0.2"));
  CHECK_FALSE(troupe::is_loopback_address("10.0.0.1"));
}

TEST_CASE("an unresolvable master address is a bad_argument naming it", "[actors][address]") {
  try {
    troupe::routable_address("no-such-host.invalid");
    FAIL("resolved");
  } catch (const troupe::error& e) {
    CHECK(e.code() == troupe::errc::bad_argument);
    CHECK_THAT(e.message(), Catch::Contains("no-such-host.invalid"));
  }
}

TEST_CASE("the first host of a Slurm node list is the master", "[actors][address]") {
  CHECK(troupe::first_slurm_host("node7") == "node7");
  CHECK(troupe::first_slurm_host("gpu[03-05,9],cpu1") == "gpu03");
  CHECK(troupe::first_slurm_host("a1,b[2-3]") == "a1");
  CHECK(troupe::first_slurm_host("rack[2,4]-n[1-2]") == "rack2-n[1-2]");
  CHECK_THROWS_AS(troupe::first_slurm_host(""), troupe::error);
  CHECK_THROWS_AS(troupe::first_slurm_host("gpu[03-05"), troupe::error);
}

TEST_CASE("from_env reads the launcher variables and the listen address", "[actors][address]") {
  // A launcher's RANK wins over Slurm's SLURM_PROCID.
  env_scope env(launcher_env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"},
                              {"MASTER_PORT", "29400"}, {"TROUPE_LISTEN_ADDR", "0.0.0.0"}, {"SLURM_PROCID", "9"}}));
  const auto o = troupe::node_options::from_env();
  CHECK(o.rank == 3);
  CHECK(o.world_size == 4);
  CHECK(o.local_rank == 1);
  CHECK(o.master_port == 29400);
  CHECK(o.listen_addr == "0.0.0.0");
}

TEST_CASE("without launcher variables from_env reads Slurm's", "[actors][address]") {
  env_scope env(launcher_env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                              {"SLURM_JOB_NODELIST", "localhost,other[1-3]"}, {"SLURM_JOB_ID", "12345"}}));
  const auto o = troupe::node_options::from_env();
  CHECK(o.rank == 5);
  CHECK(o.world_size == 8);
  CHECK(o.local_rank == 1);
  CHECK(o.master_addr == "localhost");
  CHECK(o.master_port == 29500 + 345);
  CHECK(o.listen_addr == "127.0.0.1");  // the master is on loopback
}

TEST_CASE("a bad Slurm variable is a bad_argument naming it", "[actors][address]") {
  env_scope env(launcher_env({{"SLURM_PROCID", "x"}}));
  CHECK_THROWS_WITH(troupe::node_options::from_env(), Catch::Contains("SLURM_PROCID"));
}
