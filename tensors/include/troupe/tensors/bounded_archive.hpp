#pragma once
/// \file bounded_archive.hpp
/// A Boost binary input archive that never allocates more than its input can fill.
///
/// Note [bounded archive]
/// boost::archive::binary_iarchive trusts every length it reads. A collection count or a string
/// length is allocated (resize) before a single element is read. So a few crafted bytes can ask
/// for gigabytes. bounded_iarchive reads the same format (written by binary_oarchive) and checks
/// each such length against the bytes left in its input before anything is allocated:
///   * a collection (vector, map, set, ...) of n elements needs n <= bytes left (every element
///     takes a byte at least; a collection of empty elements larger than its input is refused);
///   * a string of n bytes needs n <= bytes left;
///   * a bool is the byte 0 or 1;
///   * raw C strings (char*, wchar_t*) cannot be bounded and are refused;
///   * tensors are bounded as in boost_tensor.hpp (bound_tensor_loads is applied).
/// A violation throws troupe::error with the code given at construction (protocol_violation for
/// peer data, checkpoint_corrupt for files), naming the field. The stream buffer must be seekable
/// (a std::stringbuf or a span over bytes), since the bytes left are measured by seeking; one
/// that is not is refused at construction.

#include <cstdint>
#include <streambuf>
#include <string>

#include <boost/archive/binary_iarchive_impl.hpp>
#include <boost/archive/detail/register_archive.hpp>
#include <boost/serialization/collection_size_type.hpp>

#include "troupe/tensors/error.hpp"

namespace troupe {

/// A binary input archive bounded by its input (Note [bounded archive]).
class bounded_iarchive
    : public boost::archive::binary_iarchive_impl<bounded_iarchive, std::istream::char_type, std::istream::traits_type> {
  using base = boost::archive::binary_iarchive_impl<bounded_iarchive, std::istream::char_type, std::istream::traits_type>;

 public:
  /// Reads from `sb` (seekable) between its position and its end. `code` is the error code of a
  /// violation; `what` starts its messages (the file or the payload read). Throws `code` when
  /// `sb` cannot be measured.
  bounded_iarchive(std::streambuf& sb, unsigned flags, errc code, std::string what);

  /// Bytes left in the input.
  std::uint64_t remaining() const;

  // Boost calls these through the most derived archive (load_access, interface_iarchive).
  using base::load;
  void load(bool& t);
  void load(std::string& s);
  void load(std::wstring& s);
  void load(char* t);
  void load(wchar_t* t);
  template <class T>
  void load_override(T& t) {
    base::load_override(t);
  }
  void load_override(boost::serialization::collection_size_type& t);

 private:
  /// Throws unless `n` items of at least `unit` bytes fit in the bytes left; `field` names them.
  void check_fits(std::uint64_t n, std::uint64_t unit, const char* field) const;
  [[noreturn]] void refuse(const std::string& why) const;

  std::streambuf& sb_;
  std::uint64_t end_ = 0;
  errc code_;
  std::string what_;
};

}  // namespace troupe

BOOST_SERIALIZATION_REGISTER_ARCHIVE(troupe::bounded_iarchive)
BOOST_SERIALIZATION_USE_ARRAY_OPTIMIZATION(troupe::bounded_iarchive)
