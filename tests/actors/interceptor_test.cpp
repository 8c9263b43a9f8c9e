// Single-process tests of the call interceptor's seam in the codec (Note [call interceptor]):
// the codec reports to the scope of the context it is given, and only to it.
#include <catch2/catch.hpp>

#include "troupe/actors/rpc/codec.hpp"
#include "troupe/actors/rpc/interceptor.hpp"
#include "troupe/tensors/factories.hpp"

namespace {

struct counting_scope : troupe::rpc::call_scope {
  int written = 0, read = 0, entered = 0, left = 0;
  void on_tensor_written(const troupe::tensor&) override { ++written; }
  troupe::tensor on_tensor_read(troupe::tensor t) override {
    ++read;
    return t;
  }
  void enter() override { ++entered; }
  void leave() override { ++left; }
};

troupe::rpc::codec_context with_scope(troupe::rpc::call_scope* s) {
  troupe::rpc::codec_context ctx;
  ctx.scope = s;
  return ctx;
}

}  // namespace

TEST_CASE("the codec reports to the scope of its context only, and a plain context reports to no one", "[actors][rpc][interceptor]") {
  counting_scope outer, inner;
  const auto outer_ctx = with_scope(&outer), inner_ctx = with_scope(&inner);
  const auto args = troupe::rpc::encode_args<troupe::tensor, std::vector<troupe::tensor>>(
      outer_ctx, troupe::ones({2}), {troupe::ones({1}), troupe::tensor()});
  CHECK(outer.written == 2);  // the undefined tensor is not reported
  // A nested encode with a context of its own reports to its scope, not to the one around it.
  (void)troupe::rpc::encode_result<troupe::tensor>(inner_ctx, troupe::ones({3}));
  CHECK(inner.written == 1);
  CHECK(outer.written == 2);
  (void)troupe::rpc::encode_result<troupe::tensor>(troupe::ones({3}));  // the plain context
  (void)troupe::rpc::decode_args<troupe::tensor, std::vector<troupe::tensor>>(args, "f");
  CHECK(outer.written + inner.written + outer.read + inner.read == 3);
  (void)troupe::rpc::decode_args<troupe::tensor, std::vector<troupe::tensor>>(inner_ctx, args, "f");
  CHECK(inner.read == 2);
  CHECK(outer.read == 0);
  CHECK(outer.entered + outer.left + inner.entered + inner.left == 0);  // the codec enters nothing
}

TEST_CASE("a scope guard enters its scope and leaves it once, and a null guard does nothing", "[actors][rpc][interceptor]") {
  counting_scope outer, inner;
  {
    troupe::rpc::scope_guard g1(&outer);
    CHECK(outer.entered == 1);
    {
      troupe::rpc::scope_guard g2(&inner);
      CHECK(inner.entered == 1);
      CHECK(outer.left == 0);  // a guard inside does not make the outer scope leave
    }
    CHECK(inner.left == 1);
    troupe::rpc::scope_guard none(nullptr);
  }
  CHECK(outer.left == 1);
  CHECK(outer.entered == 1);
}
