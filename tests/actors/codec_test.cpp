// Single-process tests of the RPC codec and registry (Note [rpc payload]).
#include <catch2/catch.hpp>

#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/rpc/registry.hpp"
#include "troupe/tensors/factories.hpp"

using troupe::errc;

namespace {
std::string shout(std::string s) { return s + "!"; }

troupe::errc code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const troupe::error& e) {
    return e.code();
  }
  return errc::ok;
}
}  // namespace

TEST_CASE("type tags name arithmetic types, containers and tensors portably", "[actors][codec]") {
  CHECK(troupe::rpc::type_tag<int>() == "int32");
  CHECK(troupe::rpc::type_tag<std::int64_t>() == "int64");
  CHECK(troupe::rpc::type_tag<double>() == "float64");
  CHECK(troupe::rpc::type_tag<std::vector<float>>() == "vector<float32>");
  CHECK(troupe::rpc::type_tag<std::map<std::string, std::vector<int>>>() == "map<string,vector<int32>>");
  CHECK(troupe::rpc::type_tag<std::tuple<int, troupe::tensor>>() == "tuple<int32,tensor>");
}

TEST_CASE("the callee's decode names the wrong argument with expected and received types", "[actors][codec]") {
  const auto bytes = troupe::rpc::encode_args<int, std::string>(1, "x");
  const auto ok = troupe::rpc::decode_args<int, std::string>(bytes, "f");
  CHECK(std::get<0>(ok) == 1);
  CHECK(std::get<1>(ok) == "x");
  try {
    troupe::rpc::decode_args<int, double>(bytes, "f");
    FAIL("type mismatch accepted");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::bad_argument);
    CHECK(e.message() == "function 'f' argument 1: expected float64, got string");
  }
  CHECK(code_of([&] { troupe::rpc::decode_args<int>(bytes, "f"); }) == errc::bad_argument);  // arity
  const std::vector<char> truncated(bytes.begin(), bytes.begin() + 6);
  CHECK(code_of([&] { troupe::rpc::decode_args<int, std::string>(truncated, "f"); }) == errc::bad_argument);
}

TEST_CASE("a tensor round-trips through the codec with dtype, shape and bytes", "[actors][codec]") {
  auto t = troupe::from_vector(std::vector<std::int64_t>{1, -2, 3, 4, 5, 6}, {3, 2});
  auto back = std::get<0>(troupe::rpc::decode_args<troupe::tensor>(troupe::rpc::encode_args(t), "f"));
  REQUIRE(back.dtype() == troupe::dtype::int64);
  REQUIRE(back.sizes() == troupe::shape_t{3, 2});
  CHECK(back.data<std::int64_t>()[1] == -2);
  CHECK_FALSE(back.is_same(t));
  auto empty_back = std::get<0>(troupe::rpc::decode_args<troupe::tensor>(troupe::rpc::encode_args(troupe::tensor()), "f"));
  CHECK_FALSE(empty_back.defined());
}

TEST_CASE("a registry entry separates decode errors from the user function's exceptions", "[actors][codec]") {
  troupe::rpc::registry reg;
  reg.add("inc", [](int x) { return x + 1; });
  reg.add("throws", [](int) -> int { throw std::logic_error("nope"); });
  auto inc = reg.find("inc");
  REQUIRE(inc);
  CHECK(inc->signature == "int32(int32)");
  bool started = false;
  const auto out = inc->invoke(troupe::rpc::plain_context, troupe::rpc::encode_args(41), [&] { started = true; }, nullptr);
  CHECK(started);
  CHECK(troupe::rpc::decode_result<int>(out, "inc") == 42);
  started = false;
  CHECK(code_of([&] { inc->invoke(troupe::rpc::plain_context, troupe::rpc::encode_args(std::string("41")), [&] { started = true; }, nullptr); }) == errc::bad_argument);
  CHECK_FALSE(started);
  CHECK_THROWS_AS(reg.find("throws")->invoke(troupe::rpc::plain_context, troupe::rpc::encode_args(1), [] {}, nullptr), std::logic_error);
  CHECK(reg.find("missing") == nullptr);
  TROUPE_RPC_FUNCTION(reg, shout);
  REQUIRE(reg.find("shout"));
  CHECK(reg.find("shout")->signature == "string(string)");
}

TEST_CASE("troupe errors survive the conversion to caf::error and back", "[actors][codec]") {
  const troupe::error e(errc::peer_lost, "worker3 lost");
  const auto back = troupe::from_caf_error(troupe::to_caf_error(e), "ignored");
  CHECK(back.code() == errc::peer_lost);
  CHECK(back.message() == "worker3 lost");
}

TEST_CASE("an empty caf::error converts to invalid_state naming the normal exit", "[actors][codec]") {
  const auto back = troupe::from_caf_error(caf::error{}, "down_msg of worker1");
  CHECK(back.code() == errc::invalid_state);
  CHECK(back.message().find("down_msg of worker1") != std::string::npos);
  CHECK(back.message().find("normal exit") != std::string::npos);
}
