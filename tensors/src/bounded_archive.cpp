// Note [bounded archive] (troupe/tensors/bounded_archive.hpp), and the instantiation of Boost's
// binary archive templates for it (Boost's library instantiates them for its own archives only).
#include "troupe/tensors/bounded_archive.hpp"

#include <ios>

#include <boost/archive/detail/archive_serializer_map.hpp>
#include <boost/archive/impl/archive_serializer_map.ipp>
#include <boost/archive/impl/basic_binary_iarchive.ipp>
#include <boost/archive/impl/basic_binary_iprimitive.ipp>

#include "troupe/tensors/boost_tensor.hpp"

namespace boost::archive {
template class detail::archive_serializer_map<troupe::bounded_iarchive>;
template class basic_binary_iprimitive<troupe::bounded_iarchive, std::istream::char_type, std::istream::traits_type>;
template class basic_binary_iarchive<troupe::bounded_iarchive>;
template class binary_iarchive_impl<troupe::bounded_iarchive, std::istream::char_type, std::istream::traits_type>;
}  // namespace boost::archive

namespace troupe {

namespace {
// The end of the input, or -1 when `sb` cannot seek (its position is left where it was).
std::streamoff input_end(std::streambuf& sb) {
  const auto cur = sb.pubseekoff(0, std::ios::cur, std::ios::in);
  const auto end = sb.pubseekoff(0, std::ios::end, std::ios::in);
  if (cur < 0 || end < 0 || sb.pubseekpos(cur, std::ios::in) != cur) return -1;
  return static_cast<std::streamoff>(end);
}
}  // namespace

bounded_iarchive::bounded_iarchive(std::streambuf& sb, unsigned flags, errc code, std::string what)
    : base(sb, flags), sb_(sb), code_(code), what_(std::move(what)) {
  const std::streamoff end = input_end(sb);
  if (end < 0) refuse("the input cannot be measured, so its lengths cannot be bounded");
  end_ = static_cast<std::uint64_t>(end);
  init(flags);
  bound_tensor_loads(*this, sb);
}

std::uint64_t bounded_iarchive::remaining() const {
  const auto cur = sb_.pubseekoff(0, std::ios::cur, std::ios::in);
  if (cur < 0) return 0;
  const auto pos = static_cast<std::uint64_t>(static_cast<std::streamoff>(cur));
  return pos > end_ ? 0 : end_ - pos;
}

void bounded_iarchive::refuse(const std::string& why) const { throw error(code_, what_ + ": " + why); }

void bounded_iarchive::check_fits(std::uint64_t n, std::uint64_t unit, const char* field) const {
  const std::uint64_t left = remaining();
  if (n > left / unit)
    refuse(std::string(field) + " of " + std::to_string(n) + " is larger than the " + std::to_string(left) + " bytes left");
}

void bounded_iarchive::load(bool& t) {
  unsigned char b = 0;
  load_binary(&b, 1);
  if (b > 1) refuse("a bool holds the byte " + std::to_string(b) + " (only 0 and 1 are bools)");
  t = b == 1;
}

void bounded_iarchive::load(std::string& s) {
  std::size_t n = 0;
  load(n);
  check_fits(n, 1, "a string length");
  s.resize(n);
  if (n > 0) load_binary(s.data(), n);
}

void bounded_iarchive::load(std::wstring& s) {
  std::size_t n = 0;
  load(n);
  check_fits(n, sizeof(wchar_t), "a wide string length");
  s.resize(n);
  if (n > 0) load_binary(s.data(), n * sizeof(wchar_t));
}

void bounded_iarchive::load(char*) { refuse("a raw C string cannot be bounded"); }
void bounded_iarchive::load(wchar_t*) { refuse("a raw wide C string cannot be bounded"); }

void bounded_iarchive::load_override(boost::serialization::collection_size_type& t) {
  base::load_override(t);
  check_fits(static_cast<std::uint64_t>(t), 1, "a collection size");
}

}  // namespace troupe
