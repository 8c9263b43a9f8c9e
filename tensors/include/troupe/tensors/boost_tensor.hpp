#pragma once
/// \file boost_tensor.hpp
/// Boost.Serialization support for troupe::tensor, so tensors can sit inside bigger Boost
/// archives (a checkpoint holding model, optimizer state, step and generator state). Use binary
/// archives (boost/archive/binary_[io]archive.hpp); include boost/serialization/map.hpp and
/// string.hpp as well to archive a whole state_dict.
///
/// A tensor is archived as a record (Note [Tensor file format] in serialization.hpp). The record
/// holds the record version, the defined flag, dtype, rank, sizes, byte count and checksum64 of the
/// bytes. Then come the bytes as one binary blob, never element by element. CUDA tensors are
/// copied to the host for saving;
/// loaded tensors are contiguous CPU tensors. Loading validates every field and the checksum and
/// throws troupe::error(checkpoint_corrupt) on a bad record; Boost itself throws
/// boost::archive::archive_exception when the input ends early.
///
/// Allocation bound: a corrupted byte count must not make the loader allocate more than the
/// input holds. Call bound_tensor_loads(ar, streambuf) after opening an input archive over a
/// seekable stream. Then every tensor's size is checked against the bytes left. Without it,
/// large tensors are read in chunks, so memory grows only with bytes actually read.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <streambuf>
#include <vector>

#include <boost/serialization/binary_object.hpp>
#include <boost/serialization/level.hpp>
#include <boost/serialization/split_free.hpp>
#include <boost/serialization/tracking.hpp>

#include "troupe/tensors/tensor.hpp"

namespace troupe::detail {

/// Archive helper (ar.get_helper) remembering where the input ends.
class archive_input_bound {
 public:
  /// Bounds loads by the bytes of `sb` between its current position and its end.
  void set(std::streambuf& sb);
  /// Bytes left in the input, or nullopt when unknown.
  std::optional<std::uint64_t> remaining() const;

 private:
  std::streambuf* sb_ = nullptr;
  std::uint64_t end_ = 0;
};

/// The fixed part of a tensor record, as read from an archive.
struct tensor_record {
  std::uint8_t version = 0;
  std::uint8_t defined = 0;
  std::uint8_t dtype = 0;
  std::uint32_t rank = 0;
  shape_t sizes;
  std::uint64_t nbytes = 0;
  std::uint64_t checksum = 0;
};

inline constexpr std::uint8_t tensor_record_version = 1;
inline constexpr std::uint32_t max_tensor_rank = 64;
inline constexpr std::size_t tensor_load_chunk = std::size_t{16} << 20;

/// `t` as a contiguous CPU tensor (itself when it already is one).
tensor host_contiguous(const tensor& t);
/// checksum64 of the bytes of a contiguous CPU tensor.
std::uint64_t tensor_checksum(const tensor& t);
/// Throws checkpoint_corrupt unless version, defined flag, dtype and rank are valid.
void check_record_prefix(const tensor_record& r);
/// Throws checkpoint_corrupt unless sizes and byte count agree and fit in `remaining` bytes.
void check_record_sizes(const tensor_record& r, std::optional<std::uint64_t> remaining);
/// A new contiguous CPU tensor of the record's dtype and sizes.
tensor allocate_for_record(const tensor_record& r);
/// Throws checkpoint_corrupt when the loaded bytes do not match the record's checksum.
void check_record_checksum(const tensor& t, const tensor_record& r);

}  // namespace troupe::detail

namespace troupe {

/// Bounds every tensor allocation made while loading from `ar` by the bytes left in `sb` (the
/// stream buffer the archive reads; it must be seekable). Call right after opening the archive.
template <class Archive>
void bound_tensor_loads(Archive& ar, std::streambuf& sb) {
  ar.template get_helper<detail::archive_input_bound>().set(sb);
}

}  // namespace troupe

namespace boost::serialization {

/// Saves a tensor record (see the file comment). Blocks on a device-to-host copy for CUDA.
template <class Archive>
void save(Archive& ar, const troupe::tensor& t, const unsigned int /*version*/) {
  troupe::detail::tensor_record r;
  r.version = troupe::detail::tensor_record_version;
  r.defined = t.defined() ? 1 : 0;
  ar << r.version << r.defined;
  if (!t.defined()) return;
  const troupe::tensor h = troupe::detail::host_contiguous(t);
  r.dtype = static_cast<std::uint8_t>(h.dtype());
  r.rank = static_cast<std::uint32_t>(h.dim());
  ar << r.dtype << r.rank;
  for (std::int64_t s : h.sizes()) ar << s;
  r.nbytes = h.nbytes();
  r.checksum = troupe::detail::tensor_checksum(h);
  ar << r.nbytes << r.checksum;
  if (r.nbytes > 0) ar << make_binary_object(h.data_ptr(), r.nbytes);
}

/// Loads a tensor record into a new contiguous CPU tensor; throws troupe::error
/// (checkpoint_corrupt) on an invalid record or checksum mismatch.
template <class Archive>
void load(Archive& ar, troupe::tensor& t, const unsigned int /*version*/) {
  troupe::detail::tensor_record r;
  ar >> r.version >> r.defined;
  troupe::detail::check_record_prefix(r);
  if (!r.defined) {
    t = troupe::tensor();
    return;
  }
  ar >> r.dtype >> r.rank;
  troupe::detail::check_record_prefix(r);
  r.sizes.resize(r.rank);
  for (auto& s : r.sizes) ar >> s;
  ar >> r.nbytes >> r.checksum;
  const auto remaining = ar.template get_helper<troupe::detail::archive_input_bound>().remaining();
  troupe::detail::check_record_sizes(r, remaining);
  troupe::tensor out;
  if (remaining || r.nbytes <= troupe::detail::tensor_load_chunk) {
    out = troupe::detail::allocate_for_record(r);
    if (r.nbytes > 0) ar >> make_binary_object(out.data_ptr(), r.nbytes);
  } else {
    // Unknown input size: grow with the bytes actually read, so a corrupted count fails at the
    // end of the input instead of allocating it up front.
    std::vector<char> buf;
    for (std::uint64_t off = 0; off < r.nbytes; off += troupe::detail::tensor_load_chunk) {
      const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(troupe::detail::tensor_load_chunk, r.nbytes - off));
      buf.resize(static_cast<std::size_t>(off) + n);
      ar >> make_binary_object(buf.data() + off, n);
    }
    out = troupe::detail::allocate_for_record(r);
    std::memcpy(out.data_ptr(), buf.data(), buf.size());
  }
  troupe::detail::check_record_checksum(out, r);
  t = std::move(out);
}

}  // namespace boost::serialization

BOOST_SERIALIZATION_SPLIT_FREE(troupe::tensor)
BOOST_CLASS_IMPLEMENTATION(troupe::tensor, boost::serialization::object_serializable)
BOOST_CLASS_TRACKING(troupe::tensor, boost::serialization::track_never)
