// Note [bounded archive] (troupe/tensors/bounded_archive.hpp): lengths read from an archive are
// checked against the input before anything is allocated; element counts never overflow.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <boost/archive/binary_oarchive.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>

#include <catch2/catch.hpp>

#include "troupe/tensors/bounded_archive.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/serialization.hpp"
#include "troupe/tensors/state_dict.hpp"
#include "../../tensors/src/checksum.hpp"

using troupe::errc;

namespace {

constexpr unsigned flags = boost::archive::no_header | boost::archive::no_codecvt;

template <class T>
std::string archived(const T& x) {
  std::ostringstream out(std::ios::binary);
  {
    boost::archive::binary_oarchive ar(out, flags);
    ar << x;
  }
  return std::move(out).str();
}

// Loads a T from `bytes` with a bounded archive; returns the error it throws (ok when none).
template <class T>
troupe::error load_error(const std::string& bytes, T& x) {
  try {
    std::istringstream in(bytes, std::ios::binary);
    troupe::bounded_iarchive ar(*in.rdbuf(), flags, errc::protocol_violation, "test input");
    ar >> x;
  } catch (const troupe::error& e) {
    return e;
  }
  return troupe::error(errc::ok, "");
}

// Writes `v` as 8 little-endian bytes at `at`.
void put_u64(std::string& s, std::size_t at, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) s[at + static_cast<std::size_t>(i)] = static_cast<char>(v >> (8 * i));
}

}  // namespace

TEST_CASE("a shape whose element count overflows an int64 is refused, not wrapped", "[tensors][bounds]") {
  const troupe::shape_t huge{(std::int64_t{1} << 62) + 1, 4};
  CHECK_THROWS_MATCHES(troupe::numel_of(huge), troupe::error,
                       Catch::Predicate<troupe::error>([](const troupe::error& e) { return e.code() == errc::bad_argument; }));
  CHECK_THROWS_AS(troupe::empty(huge), troupe::error);
  CHECK_THROWS_AS(troupe::nbytes_of({std::int64_t{1} << 61, 8}, troupe::dtype::float32), troupe::error);
  CHECK_THROWS_AS(troupe::numel_of({0, std::int64_t{1} << 62, 1 << 2}), troupe::error);  // strides would overflow
  CHECK(troupe::numel_of({3, 0, 5}) == 0);
  CHECK(troupe::numel_of({}) == 1);
  CHECK(troupe::nbytes_of({2, 3}, troupe::dtype::float64) == 48);
}

TEST_CASE("a Boost archive claiming a huge vector length fails before allocating it", "[tensors][bounds]") {
  std::string bytes = archived(std::vector<std::int64_t>{1, 2, 3});
  put_u64(bytes, 0, std::uint64_t{1} << 40);  // the collection count comes first
  std::vector<std::int64_t> v;
  const auto e = load_error(bytes, v);
  CHECK(e.code() == errc::protocol_violation);
  CHECK_THAT(e.message(), Catch::Contains("collection size of 1099511627776"));
  CHECK(v.capacity() < 1024);
}

TEST_CASE("a Boost archive claiming a huge string length fails before allocating it", "[tensors][bounds]") {
  std::string bytes = archived(std::string("abc"));
  put_u64(bytes, 0, std::uint64_t{1} << 40);
  std::string s;
  const auto e = load_error(bytes, s);
  CHECK(e.code() == errc::protocol_violation);
  CHECK_THAT(e.message(), Catch::Contains("string length of 1099511627776"));
  CHECK(s.capacity() < 1024);
}

TEST_CASE("a Boost archive bool other than 0 or 1 is refused", "[tensors][bounds]") {
  std::string bytes = archived(true);
  REQUIRE(bytes.size() == 1);
  bytes[0] = 72;
  bool b = false;
  const auto e = load_error(bytes, b);
  CHECK(e.code() == errc::protocol_violation);
  CHECK_THAT(e.message(), Catch::Contains("byte 72"));
}

TEST_CASE("a bounded archive reads what binary_oarchive wrote", "[tensors][bounds]") {
  const std::vector<std::string> words{"a", "", "bcd"};
  std::vector<std::string> got;
  CHECK(load_error(archived(words), got).code() == errc::ok);
  CHECK(got == words);
}

TEST_CASE("a state dict file with a huge name length or cut short is checkpoint_corrupt", "[tensors][bounds]") {
  const std::string path = "/tmp/troupe_bounded_sd_" + std::to_string(::getpid()) + ".bin";
  troupe::save_state_dict({{"w", troupe::ones({2})}}, path);
  std::string file;
  {
    std::ifstream in(path, std::ios::binary);
    file.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::size_t header = 40;
  // The payload: an archive header, the entry count, the name length, the name "w".
  const std::string name_len("\x01\0\0\0\0\0\0\0w", 9);
  const auto at = file.find(name_len, header);
  REQUIRE(at != std::string::npos);
  auto rewrite = [&](std::string bytes) {
    put_u64(bytes, 16, bytes.size() - header);  // payload length, then its checksum
    put_u64(bytes, 24, troupe::detail::checksum64(bytes.data() + header, bytes.size() - header));
    put_u64(bytes, 32, troupe::detail::checksum64(bytes.data(), 32));
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  };
  auto code_of_load = [&] {
    try {
      (void)troupe::load_state_dict_file(path);
    } catch (const troupe::error& e) {
      return e.code();
    }
    return errc::ok;
  };
  std::string huge = file;
  put_u64(huge, at, std::uint64_t{1} << 40);
  rewrite(huge);
  CHECK(code_of_load() == errc::checkpoint_corrupt);
  std::string cut = file.substr(0, at + 4);
  rewrite(cut);
  CHECK(code_of_load() == errc::checkpoint_corrupt);
  std::remove(path.c_str());
}

TEST_CASE("saving and loading an empty tensor reads no byte through a null pointer", "[tensors][bounds]") {
  // checksum64 of no bytes is the same whatever the pointer (an empty tensor's is null).
  const char one = 'x';
  CHECK(troupe::detail::checksum64(nullptr, 0) == troupe::detail::checksum64(&one, 0));
  const std::string path = "/tmp/troupe_bounded_empty_" + std::to_string(::getpid()) + ".bin";
  troupe::save_tensor(troupe::empty({0, 3}), path);
  const auto t = troupe::load_tensor(path);
  CHECK(t.sizes() == troupe::shape_t{0, 3});
  std::remove(path.c_str());
}
