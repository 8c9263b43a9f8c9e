// Harness: tensor and state-dict files (troupe/tensors/serialization.hpp, Note [Tensor file
// format]) read back by load_tensor and load_state_dict_file.
// Input: a selector byte, then the file's bytes. Bit 0 of the selector: a state dict, else a
// tensor. Bit 1: the header's length and both checksums are made right first. Then mutations of
// the payload reach the archive reader instead of stopping at a checksum.
#include <vector>

#include "checksum.hpp"
#include "fuzz_input.hpp"
#include "troupe/tensors/serialization.hpp"

namespace {

constexpr std::size_t header_size = 40;

void put_u64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

// The length field and both checksums of a file's header, made to match its bytes.
void fix_header(std::vector<std::uint8_t>& f) {
  if (f.size() < header_size) return;
  put_u64(f.data() + 16, f.size() - header_size);
  put_u64(f.data() + 24, troupe::detail::checksum64(f.data() + header_size, f.size() - header_size));
  put_u64(f.data() + 32, troupe::detail::checksum64(f.data(), 32));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::vector<std::uint8_t> bytes(data + 1, data + size);
  if (data[0] & 2) fix_header(bytes);
  troupe::fuzz::memory_file file(bytes.data(), bytes.size());
  troupe::fuzz::refused_ok([&] {
    if (data[0] & 1) {
      for (const auto& [name, t] : troupe::load_state_dict_file(file.path()))
        if (t.defined()) (void)t.sum();
    } else if (const auto t = troupe::load_tensor(file.path()); t.defined()) {
      (void)t.sum();
    }
  });
  return 0;
}
