// Single-process tests of the scope stack of the call interceptor (Note [call interceptor]).
#include <catch2/catch.hpp>

#include "troupe/actors/rpc/codec.hpp"
#include "troupe/actors/rpc/interceptor.hpp"
#include "troupe/tensors/factories.hpp"

namespace {

struct counting_scope : troupe::rpc::call_scope {
  int written = 0, entered = 0, left = 0;
  void on_tensor_written(const troupe::tensor&) override { ++written; }
  void enter() override { ++entered; }
  void leave() override { ++left; }
};

}  // namespace

TEST_CASE("scopes stack per thread, the codec reports to the top one, and a hidden scope sees nothing", "[actors][rpc][interceptor]") {
  counting_scope outer, inner;
  CHECK(troupe::rpc::active_scope() == nullptr);
  {
    troupe::rpc::scope_guard g1(&outer);
    CHECK(outer.entered == 1);
    (void)troupe::rpc::encode_args<troupe::tensor, std::vector<troupe::tensor>>(troupe::ones({2}), {troupe::ones({1}), troupe::tensor()});
    CHECK(outer.written == 2);  // the undefined tensor is not reported
    {
      troupe::rpc::scope_guard g2(&inner);
      CHECK(troupe::rpc::active_scope() == &inner);
      (void)troupe::rpc::encode_result<troupe::tensor>(troupe::ones({3}));
      CHECK(inner.written == 1);
      CHECK(outer.left == 0);  // a scope pushed on top does not make the one below leave
    }
    CHECK(inner.left == 1);
    {
      troupe::rpc::hide_scope hidden;
      CHECK(troupe::rpc::active_scope() == nullptr);
      (void)troupe::rpc::encode_result<troupe::tensor>(troupe::ones({3}));
      troupe::rpc::scope_guard g3(&inner);  // a guard inside nests normally
      CHECK(troupe::rpc::active_scope() == &inner);
    }
    CHECK(troupe::rpc::active_scope() == &outer);
    CHECK(outer.written == 2);
    troupe::rpc::scope_guard none(nullptr);  // pushes nothing
    CHECK(troupe::rpc::active_scope() == &outer);
  }
  CHECK(outer.left == 1);
  CHECK(troupe::rpc::active_scope() == nullptr);
}
