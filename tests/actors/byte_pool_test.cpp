// Note [byte pool] (actors/src/rpc/byte_pool.hpp): the node's buffers of large payloads.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "rpc/byte_pool.hpp"

using troupe::detail::byte_pool;

namespace {

constexpr std::size_t mib = std::size_t{1} << 20;

std::vector<char> with_capacity(std::size_t n) {
  std::vector<char> v;
  v.reserve(n);
  return v;
}

}  // namespace

TEST_CASE("a kept buffer is handed out again for a need it fits, and the vector keeps its bytes", "[actors][rpc]") {
  byte_pool pool;
  auto buf = with_capacity(8 * mib);
  const char* room = buf.data();
  pool.give(std::move(buf));
  CHECK(buf.capacity() == 0);
  CHECK(pool.kept_buffers() == 1);
  CHECK(pool.kept_bytes() >= 8 * mib);

  std::vector<char> v(10);
  std::memcpy(v.data(), "0123456789", 10);
  REQUIRE(pool.reserve(v, 6 * mib));
  CHECK(v.data() == room);
  CHECK(v.capacity() >= 8 * mib);
  CHECK(std::memcmp(v.data(), "0123456789", 10) == 0);
  CHECK(pool.kept_buffers() == 0);  // v's old 10 bytes are not worth keeping
}

TEST_CASE("a buffer over four times the need stays kept, and the need gets a fresh rounded-up one", "[actors][rpc]") {
  byte_pool pool;
  pool.give(with_capacity(64 * mib));
  std::vector<char> v;
  REQUIRE(pool.reserve(v, 5 * mib + 3));
  CHECK(pool.kept_buffers() == 1);
  CHECK(v.capacity() >= 6 * mib);  // rounded up to a MiB
  // A frame a few bytes longer than the payload that filled the first buffer fits it.
  const char* room = v.data();
  pool.give(std::move(v));
  std::vector<char> w;
  REQUIRE(pool.reserve(w, 5 * mib + 40));
  CHECK(w.data() == room);
}

TEST_CASE("small needs and a vector that has room already are left alone", "[actors][rpc]") {
  byte_pool pool;
  pool.give(with_capacity(8 * mib));
  std::vector<char> small;
  CHECK_FALSE(pool.reserve(small, 1000));
  CHECK(small.capacity() < 1000);
  auto roomy = with_capacity(16 * mib);
  CHECK_FALSE(pool.reserve(roomy, 6 * mib));
  CHECK(pool.kept_buffers() == 1);
  pool.give(std::vector<char>(1000));  // too small to keep
  CHECK(pool.kept_buffers() == 1);
}

TEST_CASE("the pool keeps a bounded number of buffers, dropping the smallest first, and clear() frees them", "[actors][rpc]") {
  byte_pool pool;
  for (std::size_t i = 0; i < troupe::detail::byte_pool_max_buffers + 3; ++i) pool.give(with_capacity((4 + i) * mib));
  CHECK(pool.kept_buffers() == troupe::detail::byte_pool_max_buffers);
  CHECK(pool.kept_bytes() <= troupe::detail::byte_pool_max_bytes);
  std::vector<char> v;
  REQUIRE(pool.reserve(v, 4 * mib));  // the three smallest (4, 5, 6 MiB) went: 7 MiB is the best fit
  CHECK(v.capacity() >= 7 * mib);
  CHECK(v.capacity() < 8 * mib);
  pool.clear();
  CHECK(pool.kept_buffers() == 0);
  CHECK(pool.kept_bytes() == 0);
}

TEST_CASE("the pool never keeps more than its byte bound", "[actors][rpc]") {
  byte_pool pool;
  for (int i = 0; i < 4; ++i) pool.give(with_capacity(300 * mib));
  CHECK(pool.kept_bytes() <= troupe::detail::byte_pool_max_bytes);
  CHECK(pool.kept_buffers() == 3);
}

TEST_CASE("a fresh buffer below a MiB is rounded up to the pool's smallest size, never to twice the need", "[actors][rpc]") {
  troupe::detail::byte_pool pool;
  for (std::size_t need : {troupe::detail::byte_pool_min_bytes, std::size_t{100} << 10, mib - 1, mib + 1, 5 * mib + 3}) {
    INFO("need " << need);
    std::vector<char> v;
    pool.take(v, need);
    CHECK(v.capacity() >= need);
    CHECK(v.capacity() < 2 * need);
    CHECK(v.size() <= need);
  }
}
