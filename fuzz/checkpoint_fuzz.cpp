// Harness: training checkpoints (troupe/autograd/checkpoint.hpp, Note [Checkpoint file]) read
// back by decode_checkpoint.
// Input: a selector byte (bit 0: the header's length and checksum are made right first, so that
// mutations of the payload reach the archive reader), then the file's bytes.
#include <string>
#include <string_view>

#include "fuzz_input.hpp"
#include "troupe/autograd/checkpoint.hpp"

namespace {

constexpr std::size_t header_size = 28;

void put_u64(char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i));
}

// The length and FNV-1a 64 checksum fields of a checkpoint's header, made to match its payload.
void fix_header(std::string& f) {
  if (f.size() < header_size) return;
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (std::size_t i = header_size; i < f.size(); ++i) h = (h ^ static_cast<unsigned char>(f[i])) * 0x100000001b3ULL;
  put_u64(f.data() + 12, f.size() - header_size);
  put_u64(f.data() + 20, h);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) fix_header(bytes);
  troupe::fuzz::refused_ok([&] {
    const auto st = troupe::decode_checkpoint(bytes, "fuzz");
    for (const auto* sd : {&st.model, &st.optimizer})
      for (const auto& [name, t] : *sd)
        if (t.defined()) (void)t.sum();
  });
  return 0;
}
