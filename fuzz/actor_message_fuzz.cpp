// Harness: the bodies of the actor frames a node reads (actors/src/remote/remote_actors.cpp,
// Note [remote actors]). These are control frames, and a message frame's head and content. The
// content is a caf::message of troupe's types, a user type with a tensor, or actor handles that
// make proxies.
// Input: a selector byte (bit 0: a control frame), then the body.
// Beyond "no crash": a decoded message renders as text (every value in it is read), and a
// message that decoded encodes again to bytes that decode to the same text.
#include <caf/binary_serializer.hpp>

#include "actor_system_fixture.hpp"
#include "bounded_deserializer.hpp"
#include "fuzz_input.hpp"

namespace {

using namespace troupe;
using troupe::fuzz::require;

fuzz::actor_system_fixture* fixture = nullptr;  // lives until the process exits

void check_message(const char* body, std::size_t n) {
  auto& sys = fixture->system();
  detail::bounded_deserializer src{fixture->context(), body, n};
  detail::actor_message_head head;
  if (!detail::read_message_head(src, head)) return;
  caf::message content;
  if (!detail::read_message_content(sys, src, content).empty()) return;
  const std::string text = caf::to_string(content);
  std::vector<char> again;
  caf::binary_serializer sink{fixture->context(), again};
  if (sink(content)) return;  // a value that decodes but does not encode (a refused tensor) is no finding
  detail::bounded_deserializer src2{fixture->context(), again.data(), again.size()};
  caf::message back;
  require(detail::read_message_content(sys, src2, back).empty(), "a decoded actor message does not decode after encoding");
  require(caf::to_string(back) == text, "an actor message reads back different after encoding");
}

void check_control(const char* body, std::size_t n) {
  detail::bounded_deserializer src{fixture->context(), body, n};
  detail::actor_control_frame f;
  if (detail::read_control_frame(src, f)) (void)fixture->system().render(f.reason);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fixture = new fuzz::actor_system_fixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const char* body = reinterpret_cast<const char*>(data + 1);
  if (data[0] & 1) check_control(body, size - 1);
  else check_message(body, size - 1);
  fixture->forget_proxies();
  return 0;
}
