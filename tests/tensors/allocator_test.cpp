// The host allocator: alignment and the large-block cache (Note [CPU block cache]).
#include <catch2/catch.hpp>

#include <cstdint>

#include "troupe/tensors/allocator.hpp"
#include "troupe/tensors/factories.hpp"

using namespace troupe;

TEST_CASE("host allocations are 64-byte aligned at every size", "[tensors][allocator]") {
  for (std::size_t n : {1u, 63u, 65u, 4096u, 1u << 20, (1u << 20) + 7}) {
    data_ptr p = cpu_allocator().allocate(n);
    REQUIRE(p);
    CHECK(reinterpret_cast<std::uintptr_t>(p.get()) % 64 == 0);
  }
}

TEST_CASE("a freed large host block is reused by the next allocation of the same size", "[tensors][allocator]") {
  release_cached_cpu_memory();
  void* first = nullptr;
  {
    tensor t = empty({1 << 20}, dtype::float32);  // 4 MiB
    first = t.data_ptr();
  }
  CHECK(cached_cpu_bytes() >= (std::size_t{4} << 20));
  tensor again = empty({1 << 20}, dtype::float32);
  CHECK(again.data_ptr() == first);
  tensor other = empty({1 << 19}, dtype::float32);  // a different size never gets that block
  CHECK(other.data_ptr() != first);
}

TEST_CASE("releasing the host cache returns every cached block", "[tensors][allocator]") {
  { tensor t = empty({3 << 20}, dtype::uint8); }
  CHECK(cached_cpu_bytes() > 0);
  release_cached_cpu_memory();
  CHECK(cached_cpu_bytes() == 0);
}
