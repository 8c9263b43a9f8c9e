// Harness: the rpc payload codec (troupe/actors/rpc/codec.hpp, actors/src/rpc/codec.cpp and
// bulk_codec.cpp): argument lists and results of the types calls use, inline and shared-memory
// tensors, user structs through Boost.
// Input: a selector byte (which signature or result type; the top bit lets large inline tensors
// view the payload, Note [adopted payload]), then the payload.
#include <boost/serialization/vector.hpp>

#include "fuzz_input.hpp"
#include "troupe/actors/rpc/codec.hpp"

namespace {

using namespace troupe;

/// A user struct: decoded through its Boost serialize().
struct sample {
  std::string label;
  std::vector<double> values;
  template <class Archive>
  void serialize(Archive& ar, unsigned) {
    ar & label & values;
  }
};

// Every decoded value is read, so that a value outside its type's range (a bool byte of 72)
// is loaded and UBSan sees it.
template <class T>
void touch(const T& x) {
  std::vector<char> bytes;
  rpc::detail::writer w(bytes);
  rpc::detail::write_value(w, x);
}
void touch(const sample& s) { touch(s.label), touch(s.values); }

template <class... Args>
void args(const std::vector<char>& payload, const rpc::codec_context& ctx) {
  fuzz::refused_ok([&] { std::apply([](const auto&... a) { (touch(a), ...); }, rpc::decode_args<Args...>(ctx, payload, "fuzz")); });
}

template <class R>
void result(const std::vector<char>& payload, const rpc::codec_context& ctx) {
  fuzz::refused_ok([&] { touch(rpc::decode_result<R>(ctx, payload, "fuzz")); });
}

void decode(std::uint8_t which, const std::vector<char>& p, const rpc::codec_context& c) {
  switch (which) {
    case 0: return args<std::int32_t, double, std::string>(p, c);
    case 1: return args<std::vector<float>, std::map<std::string, std::int64_t>>(p, c);
    case 2: return args<tensor>(p, c);
    case 3: return args<tensor, std::vector<tensor>, std::int64_t>(p, c);
    case 4: return args<std::tuple<int, std::string, double>, std::vector<std::vector<std::string>>>(p, c);
    case 5: return args<bool, std::vector<bool>, char>(p, c);
    case 6: return args<sample, std::pair<std::uint8_t, float>>(p, c);
    case 7: return args<>(p, c);
    case 8: return result<std::int64_t>(p, c);
    case 9: return result<double>(p, c);
    case 10: return result<bool>(p, c);
    case 11: return result<std::string>(p, c);
    case 12: return result<tensor>(p, c);
    case 13: return result<std::vector<tensor>>(p, c);
    case 14: return result<std::map<std::string, tensor>>(p, c);
    case 15: return result<sample>(p, c);
    case 16: return result<std::vector<bool>>(p, c);
    default: return result<std::tuple<std::int32_t, std::vector<std::uint16_t>, std::string>>(p, c);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  auto payload = std::make_shared<std::vector<char>>(data + 1, data + size);
  if (data[0] & 0x80) {  // as a served request's payload: large inline tensors may view it
    rpc::detail::payload_keeper keep(*payload, payload);
    rpc::codec_context ctx;
    ctx.keeper = &keep;
    decode(data[0] & 0x7f, *payload, ctx);
  } else {
    decode(data[0] & 0x7f, *payload, rpc::plain_context);
  }
  return 0;
}
