// Harness: frame bodies of the direct rpc channel (actors/src/rpc/wire.hpp, split_frame.hpp).
// Input: a selector byte (request, response or auth body), then the body.
// Beyond "no crash": the hand-written frame codec, CAF's deserializer, parse_split_body and
// split_head_size + parse_split_parts read a body the same way (Note [frame codec]).
#include <caf/binary_deserializer.hpp>

#include "fuzz_input.hpp"
#include "rpc/split_frame.hpp"
#include "rpc/wire.hpp"

namespace {

using namespace troupe::detail;
using troupe::rpc_request;
using troupe::rpc_response;
using troupe::fuzz::require;

bool same(const rpc_request& a, const rpc_request& b) {
  return a.id == b.id && a.function == b.function && a.caller == b.caller && a.payload == b.payload && a.meta == b.meta;
}
bool same(const rpc_response& a, const rpc_response& b) {
  return a.id == b.id && a.code == b.code && a.message == b.message && a.payload == b.payload && a.meta == b.meta;
}

template <class T>
void check_message(const char* body, std::size_t n) {
  T fast;
  const bool ok = parse_body(body, n, fast);  // the frame codec: frames under split_payload_bytes
  T split;
  const bool ok_split = parse_split_body(body, n, split);  // frames of split_payload_bytes or more
  require(ok_split == ok && (!ok || same(fast, split)), "parse_split_body and parse_body disagree");
  if (ok) {  // CAF is only asked about bodies whose lengths fit (it allocates what a length says)
    T slow;
    caf::binary_deserializer src{nullptr, body, n};
    require(!src(slow) && src.remaining() == 0 && same(fast, slow), "the frame codec and CAF's deserializer disagree");
  }
  std::size_t head = 0, payload = 0;
  if (split_head_size<T>(body, n, head, payload) && head <= n) {  // fragments put together (Note [fragments])
    const std::vector<char> h(body, body + head);
    T parts;
    const bool ok_parts = parse_split_parts(h, std::vector<char>(body + head, body + n), parts);
    require(ok_parts == ok && (!ok || same(fast, parts)), "parse_split_parts and parse_body disagree");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const char* body = reinterpret_cast<const char*>(data + 1);
  const std::size_t n = size - 1;
  switch (data[0] % 3) {
    case 0: check_message<rpc_request>(body, n); break;
    case 1: check_message<rpc_response>(body, n); break;
    default: {
      channel_auth a;
      (void)parse_body(body, n, a);
    }
  }
  return 0;
}
