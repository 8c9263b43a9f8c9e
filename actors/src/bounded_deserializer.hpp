#pragma once
// A CAF binary deserializer that never allocates more than its input can fill.
//
// Note [bounded CAF reader]
//
// caf::binary_deserializer (0.17) resizes a byte vector to the length it reads before reading a
// byte of it. A varbyte of five bytes makes it allocate and zero 4 GiB. bounded_deserializer
// reads the same format: it delegates every read to a binary_deserializer over the same bytes.
// It checks each sequence length against the bytes left before CAF sees it:
//   * a sequence (vector, map, set, byte vector) of n elements needs n <= bytes left, since
//     every element takes a byte at least. So a std::vector<bool> (8 elements a byte) longer
//     than the bytes after its length is refused as well: carry flags as bytes.
//   * strings are range-checked by CAF itself before they are allocated.
// A refusal is a caf::error of category troupe, code protocol_violation. Its text names the
// length and the bytes left. violation() keeps the same text for callers without a system to
// render it. Every decoder of peer bytes through CAF uses this class. These are remote actor
// messages (remote/remote_actors.cpp), RRef control replies (rref/protocol.hpp), shared tensor
// metas (shm_channel.cpp) and frame bodies (rpc/wire.hpp).

#include <caf/binary_deserializer.hpp>
#include <caf/deserializer.hpp>
#include <caf/sec.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::detail {

/// caf::binary_deserializer with bounded sequence lengths (see the note). Not thread-safe.
class bounded_deserializer final : public caf::deserializer {
 public:
  /// Reads the `n` bytes at `data`; `ctx` as for caf::binary_deserializer (may be null).
  bounded_deserializer(caf::execution_unit* ctx, const char* data, std::size_t n);
  /// Reads `buf`; the actor system's dummy execution unit is the context.
  bounded_deserializer(caf::actor_system& sys, const std::vector<char>& buf);

  /// Bytes not read yet.
  std::size_t remaining() const noexcept { return in_.remaining(); }
  /// Why the last sequence length was refused; empty when none was.
  const std::string& violation() const noexcept { return violation_; }

  caf::error begin_object(uint16_t& typenr, std::string& name) override { return in_.begin_object(typenr, name); }
  caf::error end_object() override { return in_.end_object(); }
  /// Reads a length and refuses it (protocol_violation) when it exceeds the bytes left.
  caf::error begin_sequence(size_t& num) override;
  caf::error end_sequence() override { return in_.end_sequence(); }
  caf::error apply_raw(size_t num_bytes, void* data) override { return in_.apply_raw(num_bytes, data); }

 protected:
  caf::error apply_impl(int8_t& x) override { return in_.apply(x); }
  caf::error apply_impl(uint8_t& x) override { return in_.apply(x); }
  caf::error apply_impl(int16_t& x) override { return in_.apply(x); }
  caf::error apply_impl(uint16_t& x) override { return in_.apply(x); }
  caf::error apply_impl(int32_t& x) override { return in_.apply(x); }
  caf::error apply_impl(uint32_t& x) override { return in_.apply(x); }
  caf::error apply_impl(int64_t& x) override { return in_.apply(x); }
  caf::error apply_impl(uint64_t& x) override { return in_.apply(x); }
  caf::error apply_impl(float& x) override { return finite(x); }
  caf::error apply_impl(double& x) override { return finite(x); }
  caf::error apply_impl(long double& x) override { return finite(x); }
  caf::error apply_impl(std::string& x) override { return in_.apply(x); }
  caf::error apply_impl(std::u16string& x) override { return in_.apply(x); }
  caf::error apply_impl(std::u32string& x) override { return in_.apply(x); }

 private:
  // A non-finite float is refused. CAF's serializer loops forever on an infinity
  // (CAF-0.17-NOTES pitfall 1), so a decoded message holding one could never be sent on.
  template <class F>
  caf::error finite(F& x) {
    auto err = in_.apply(x);
    if (err || std::isfinite(x)) return err;
    return caf::make_error(caf::sec::invalid_argument, "a floating-point field that is not finite");
  }

  caf::binary_deserializer in_;
  std::string violation_;
};

}  // namespace troupe::detail
