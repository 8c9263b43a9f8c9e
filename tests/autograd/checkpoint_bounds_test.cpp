// Note [bounded archive]: a checkpoint whose archive claims more than the file holds is
// checkpoint_corrupt naming the field, and nothing of the claimed size is allocated.
#include <catch2/catch.hpp>

#include <string>

#include "troupe/autograd/checkpoint.hpp"
#include "troupe/tensors/factories.hpp"

using namespace troupe;

namespace {

constexpr std::size_t header = 8 + 4 + 8 + 8;

std::uint64_t fnv1a64(std::string_view bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

void put_u64(std::string& s, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s[at + static_cast<std::size_t>(i)] = static_cast<char>(v >> (8 * i));
}

// `bytes` with its payload length and checksum made to match its payload again.
std::string resealed(std::string bytes) {
  put_u64(bytes, 12, bytes.size() - header);
  put_u64(bytes, 20, fnv1a64(std::string_view(bytes).substr(header)));
  return bytes;
}

}  // namespace

TEST_CASE("a checkpoint claiming a huge name length is checkpoint_corrupt naming the field", "[autograd][checkpoint][bounds]") {
  checkpoint_state st;
  st.model.emplace("weight_of_the_layer", ones({2}));
  st.step = 7;
  const std::string good = encode_checkpoint(st);
  REQUIRE(resealed(good) == good);  // the test's checksum is the file's
  // The key's length (a u64) just before its bytes.
  const auto at = good.find("weight_of_the_layer");
  REQUIRE(at != std::string::npos);
  std::string bad = good;
  put_u64(bad, at - 8, std::uint64_t{1} << 40);
  try {
    (void)decode_checkpoint(resealed(bad), "ckpt.bin");
    FAIL("a huge length was accepted");
  } catch (const error& e) {
    CHECK(e.code() == errc::checkpoint_corrupt);
    CHECK_THAT(e.message(), Catch::Contains("ckpt.bin") && Catch::Contains("string length of 1099511627776"));
  }
}

TEST_CASE("a checkpoint whose archive is cut short but resealed is checkpoint_corrupt", "[autograd][checkpoint][bounds]") {
  checkpoint_state st;
  st.model.emplace("w", ones({64}));
  const std::string good = encode_checkpoint(st);
  for (std::size_t keep = header; keep < good.size(); keep += 7) {
    try {
      (void)decode_checkpoint(resealed(good.substr(0, keep)), "ckpt.bin");
      FAIL("a cut archive of " << keep << " bytes was accepted");
    } catch (const error& e) {
      CHECK(e.code() == errc::checkpoint_corrupt);
    }
  }
}
