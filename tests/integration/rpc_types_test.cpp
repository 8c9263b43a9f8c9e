// Multi-process tests: every argument type crosses processes bit-exactly.
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>

#include <boost/serialization/vector.hpp>
#include <catch2/catch.hpp>
#include <dirent.h>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/tensors/factories.hpp"

using namespace std::chrono_literals;

namespace {

struct sample {
  std::string label;
  std::vector<double> values;
  template <class Archive>
  void serialize(Archive& ar, unsigned) {
    ar & label & values;
  }
};

troupe::rpc::registry echo_functions() {
  troupe::rpc::registry reg;
  reg.add("echo_i64", [](std::int64_t x) { return x; });
  reg.add("echo_f32", [](float x) { return x; });
  reg.add("echo_f64v", [](std::vector<double> x) { return x; });
  reg.add("echo_map", [](std::map<std::string, std::int32_t> m) { return m; });
  reg.add("echo_tuple", [](std::tuple<int, std::string, double> t) { return t; });
  reg.add("echo_nested", [](std::vector<std::vector<std::string>> v) { return v; });
  reg.add("echo_tensor", [](troupe::tensor t) { return t; });
  reg.add("echo_sample", [](sample s) {
    s.label += "!";
    return s;
  });
  reg.add("mixed", [](bool b, std::uint8_t u, std::int16_t s, std::string t) { return std::to_string(b) + std::to_string(u) + std::to_string(s) + t; });
  reg.add("nothing", []() {});
  return reg;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("rpc carries arithmetic types, strings, containers, tensors and user structs bit-exactly", "[actors][rpc]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) {
    troupe::node n(troupe::test::test_options(1, 2, pipe.read()), echo_functions());
    troupe::test::serve_until_done(n, "ready", 20s);
  });
  troupe::node n(troupe::test::test_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  n.store().wait({"ready"}, 10s);
  const std::string w = "worker1";

  CHECK(troupe::rpc_sync<std::int64_t>(n, w, "echo_i64", std::int64_t{-(1LL << 40)}) == -(1LL << 40));
  CHECK(troupe::rpc_sync<float>(n, w, "echo_f32", 1.5f) == 1.5f);
  const std::vector<double> special{-0.0, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                                    std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::denorm_min(), 3.25};
  const auto back = troupe::rpc_sync<std::vector<double>>(n, w, "echo_f64v", special);
  REQUIRE(back.size() == special.size());
  for (std::size_t i = 0; i < special.size(); ++i) CHECK(same_bits(back[i], special[i]));
  const std::map<std::string, std::int32_t> m{{"a", 1}, {"b", -2}};
  CHECK(troupe::rpc_sync<std::map<std::string, std::int32_t>>(n, w, "echo_map", m) == m);
  const std::tuple<int, std::string, double> t{7, "seven", 7.5};
  CHECK(troupe::rpc_sync<std::tuple<int, std::string, double>>(n, w, "echo_tuple", t) == t);
  const std::vector<std::vector<std::string>> nested{{"x"}, {}, {"y", "z"}};
  CHECK(troupe::rpc_sync<std::vector<std::vector<std::string>>>(n, w, "echo_nested", nested) == nested);
  CHECK(troupe::rpc_sync<std::string>(n, w, "mixed", true, std::uint8_t{200}, std::int16_t{-5}, "s") == "1200-5s");
  troupe::rpc_sync<void>(n, w, "nothing");

  const std::vector<float> values{1.0f, -0.0f, std::numeric_limits<float>::infinity(), 2.5f, -7.0f, 1e-42f};
  auto tensor = troupe::from_vector(values, {2, 3});
  auto tback = troupe::rpc_sync<troupe::tensor>(n, w, "echo_tensor", tensor);
  REQUIRE(tback.sizes() == troupe::shape_t{2, 3});
  REQUIRE(tback.dtype() == troupe::dtype::float32);
  CHECK(std::memcmp(tback.data_ptr(), tensor.data_ptr(), tensor.nbytes()) == 0);
  auto transposed = troupe::rpc_sync<troupe::tensor>(n, w, "echo_tensor", tensor.t());  // non-contiguous view
  REQUIRE(transposed.sizes() == troupe::shape_t{3, 2});
  CHECK(transposed.data<float>()[1] == values[3]);

  // 4 MB: above the shared-memory threshold between same-host processes (Note [tensor over
  // shared memory]); no segment is left behind once both directions were decoded.
  const int segments_before = troupe::test::rpc_names_in_dev_shm();
  auto big = troupe::empty({1 << 20}, troupe::dtype::int32);
  for (std::int32_t i = 0; i < (1 << 20); ++i) big.data<std::int32_t>()[i] = i * 7;
  auto big_back = troupe::rpc_sync<troupe::tensor>(n, w, "echo_tensor", big);
  REQUIRE(big_back.nbytes() == big.nbytes());
  CHECK(std::memcmp(big_back.data_ptr(), big.data_ptr(), big.nbytes()) == 0);
  CHECK(troupe::test::rpc_names_in_dev_shm() == segments_before);

  sample s{"hi", {0.5, -0.0}};
  auto sback = troupe::rpc_sync<sample>(n, w, "echo_sample", s);
  CHECK(sback.label == "hi!");
  CHECK(sback.values.size() == 2);
  CHECK(same_bits(sback.values[1], -0.0));

  troupe::test::release_children(n);
  CHECK(children.join(10s));
}
