// Tensor and state-dict files, the Boost tensor record and atomic writes
// (troupe/tensors/serialization.hpp, boost_tensor.hpp).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/serialization/map.hpp>
#include <boost/serialization/string.hpp>

#include "../../tensors/src/checksum.hpp"
#include "tensors/file_test_util.hpp"
#include "troupe/tensors/allocator.hpp"
#include "troupe/tensors/boost_tensor.hpp"
#include "troupe/tensors/serialization.hpp"

namespace fs = std::filesystem;
using namespace troupe;

namespace {

using test::as_bytes;
using test::tensor_from_bytes;
struct temp_dir : test::temp_dir {
  temp_dir() : test::temp_dir("ser") {}
};

// Bit patterns covering NaN payloads, signed zeros, infinities, denormals and extremes.
std::vector<unsigned char> special_bytes(dtype t) {
  switch (t) {
    case dtype::float32: return as_bytes<std::uint32_t>({0x7fc00001, 0xffa12345, 0x80000000, 0x00000000, 0x7f800000,
                                                         0xff800000, 0x00000001, 0x807fffff, 0x3f800000, 0x7f7fffff});
    case dtype::float64: return as_bytes<std::uint64_t>({0x7ff8000000000001, 0xfff4000000000abc, 0x8000000000000000,
                                                         0x7ff0000000000000, 0xfff0000000000000, 0x0000000000000001,
                                                         0x000fffffffffffff, 0x3ff0000000000000});
    case dtype::float16:
    case dtype::bfloat16: return as_bytes<std::uint16_t>({0x7e01, 0xfd55, 0x8000, 0x7c00, 0xfc00, 0x0001, 0x83ff, 0x3c00, 0x7f81, 0xffff});
    case dtype::int32: return as_bytes<std::int32_t>({INT32_MIN, INT32_MAX, -1, 0, 7, 123456});
    case dtype::int64: return as_bytes<std::int64_t>({INT64_MIN, INT64_MAX, -1, 0, 1LL << 53, (1LL << 53) + 1});
    case dtype::uint8: {
      std::vector<unsigned char> all(256);
      for (int i = 0; i < 256; ++i) all[static_cast<std::size_t>(i)] = static_cast<unsigned char>(i);
      return all;
    }
    case dtype::boolean: return {0, 1, 1, 0, 1, 0};
  }
  return {};
}

std::vector<unsigned char> bytes_of(const tensor& t) {
  REQUIRE(t.is_cpu());
  REQUIRE(t.is_contiguous());
  std::vector<unsigned char> out(t.nbytes());
  if (!out.empty()) std::memcpy(out.data(), t.data_ptr(), out.size());
  return out;
}

void require_same(const tensor& got, const tensor& want) {
  REQUIRE(got.defined());
  CHECK(got.dtype() == want.dtype());
  CHECK(got.sizes() == want.sizes());
  CHECK(bytes_of(got) == bytes_of(detail::host_contiguous(want)));
}

std::vector<char> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Runs `load` and requires checkpoint_corrupt naming `path`.
template <class Fn>
void require_corrupt(const std::string& path, Fn&& load) {
  try {
    load();
    FAIL("loading " << path << " did not throw");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::checkpoint_corrupt);
    REQUIRE(e.message().find(path) != std::string::npos);
  }
}

tensor arange_int32(std::int32_t n, shape_t shape) {
  std::vector<std::int32_t> v(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return tensor_from_bytes(dtype::int32, std::move(shape), as_bytes(v));
}

std::vector<std::int32_t> int32_values(const tensor& t) {
  const auto b = bytes_of(t);
  std::vector<std::int32_t> v(b.size() / 4);
  if (!v.empty()) std::memcpy(v.data(), b.data(), b.size());
  return v;
}

}  // namespace

TEST_CASE("checksum64 matches the published XXH64 value of the empty input", "[tensors][serialization]") {
  CHECK(detail::checksum64("", 0) == 0xEF46DB3751D8E999ull);
  const std::string s(1000, 'x');
  CHECK(detail::checksum64(s.data(), s.size()) != detail::checksum64(s.data(), s.size() - 1));
}

TEST_CASE("checksum64 matches published XXH64 values and takes a null pointer for no bytes", "[tensors][serialization]") {
  // An empty tensor's data pointer is null: the checksum of its bytes must not offset it (UBSan).
  CHECK(detail::checksum64(nullptr, 0) == 0xEF46DB3751D8E999ull);
  CHECK(detail::checksum64("a", 1) == 0xD24EC4F1A98C6E5Bull);
  CHECK(detail::checksum64("abc", 3) == 0x44BC2CF5AD770999ull);
  const std::string s = "Nobody inspects the spammish repetition";  // stripes, words and a tail
  CHECK(detail::checksum64(s.data(), s.size()) == 0xFBCEA83C8A378BF1ull);
}

TEST_CASE("a tensor file round-trips every dtype bit-exactly, NaN payloads and denormals included",
          "[tensors][serialization]") {
  const auto t = static_cast<dtype>(GENERATE(range(0, num_dtypes)));
  CAPTURE(to_string(t));
  temp_dir tmp;
  auto bytes = special_bytes(t);
  const auto n = static_cast<std::int64_t>(bytes.size() / element_size(t));
  const tensor src = tensor_from_bytes(t, {n}, bytes);
  save_tensor(src, tmp.file("t.trp"));
  require_same(load_tensor(tmp.file("t.trp")), src);
}

TEST_CASE("a non-contiguous tensor is saved as its contiguous values", "[tensors][serialization]") {
  temp_dir tmp;
  const tensor base = arange_int32(12, {3, 4});
  SECTION("transposed") {
    save_tensor(base.transpose(0, 1), tmp.file("t.trp"));
    const tensor got = load_tensor(tmp.file("t.trp"));
    CHECK(got.sizes() == shape_t{4, 3});
    CHECK(int32_values(got) == std::vector<std::int32_t>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  }
  SECTION("strided slice with an offset") {
    save_tensor(base.slice(1, 1, 4, 2), tmp.file("t.trp"));
    const tensor got = load_tensor(tmp.file("t.trp"));
    CHECK(got.sizes() == shape_t{3, 2});
    CHECK(int32_values(got) == std::vector<std::int32_t>{1, 3, 5, 7, 9, 11});
  }
  SECTION("expanded (zero stride)") {
    save_tensor(base.select(0, 2).unsqueeze(0).expand({2, 4}), tmp.file("t.trp"));
    CHECK(int32_values(load_tensor(tmp.file("t.trp"))) == std::vector<std::int32_t>{8, 9, 10, 11, 8, 9, 10, 11});
  }
}

TEST_CASE("zero-size and 0-d tensors round-trip", "[tensors][serialization]") {
  temp_dir tmp;
  const tensor empty_t = tensor_from_bytes(dtype::float64, {3, 0, 2}, {});
  save_tensor(empty_t, tmp.file("e.trp"));
  const tensor e = load_tensor(tmp.file("e.trp"));
  CHECK(e.sizes() == shape_t{3, 0, 2});
  CHECK(e.dtype() == dtype::float64);
  CHECK(e.numel() == 0);
  const tensor scalar = tensor_from_bytes(dtype::int64, {}, as_bytes<std::int64_t>({-42}));
  save_tensor(scalar, tmp.file("s.trp"));
  require_same(load_tensor(tmp.file("s.trp")), scalar);
  CHECK(load_tensor(tmp.file("s.trp")).dim() == 0);
}

TEST_CASE("a state dict round-trips names, dtypes and shapes", "[tensors][serialization]") {
  temp_dir tmp;
  state_dict sd;
  sd["layer.0.weight"] = tensor_from_bytes(dtype::float32, {2, 5}, special_bytes(dtype::float32));
  sd["layer.0.bias"] = tensor_from_bytes(dtype::bfloat16, {10}, special_bytes(dtype::bfloat16));
  sd["steps"] = tensor_from_bytes(dtype::int64, {}, as_bytes<std::int64_t>({1000}));
  sd["mask"] = tensor_from_bytes(dtype::boolean, {2, 3}, special_bytes(dtype::boolean));
  sd["empty"] = tensor_from_bytes(dtype::uint8, {0}, {});
  sd["gr\xc3\xbc\xc3\x9f"] = arange_int32(6, {3, 2}).t();
  save_state_dict(sd, tmp.file("sd.trp"));
  const state_dict got = load_state_dict_file(tmp.file("sd.trp"));
  REQUIRE(got.size() == sd.size());
  for (const auto& [name, t] : sd) {
    CAPTURE(name);
    REQUIRE(got.count(name) == 1);
    require_same(got.at(name), t);
  }
  save_state_dict({}, tmp.file("none.trp"));
  CHECK(load_state_dict_file(tmp.file("none.trp")).empty());
}

TEST_CASE("flipping any bit of a tensor file is detected as checkpoint_corrupt", "[tensors][serialization]") {
  temp_dir tmp;
  const std::string path = tmp.file("t.trp");
  save_tensor(tensor_from_bytes(dtype::float32, {10}, special_bytes(dtype::float32)).narrow(0, 0, 4).view({2, 2}), path);
  const auto good = read_all(path);
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      auto bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      write_all(path, bad);
      CAPTURE(i, bit);
      require_corrupt(path, [&] { load_tensor(path); });
    }
  }
}

TEST_CASE("flipping any byte of a state dict file is detected as checkpoint_corrupt", "[tensors][serialization]") {
  temp_dir tmp;
  const std::string path = tmp.file("sd.trp");
  state_dict sd;
  sd["a"] = arange_int32(3, {3});
  sd["b"] = tensor_from_bytes(dtype::float16, {2}, as_bytes<std::uint16_t>({0x3c00, 0x8001}));
  save_state_dict(sd, path);
  const auto good = read_all(path);
  for (std::size_t i = 0; i < good.size(); ++i) {
    for (const unsigned char mask : {0x01, 0x80, 0xff}) {
      auto bad = good;
      bad[i] = static_cast<char>(bad[i] ^ mask);
      write_all(path, bad);
      CAPTURE(i, mask);
      require_corrupt(path, [&] { load_state_dict_file(path); });
    }
  }
}

TEST_CASE("every truncation of a tensor or state dict file is detected", "[tensors][serialization]") {
  temp_dir tmp;
  const std::string path = tmp.file("t.trp");
  state_dict sd;
  sd["w"] = arange_int32(5, {5});
  sd["x"] = arange_int32(4, {2, 2});
  save_state_dict(sd, tmp.file("sd.trp"));
  save_tensor(arange_int32(7, {7}), tmp.file("t0.trp"));
  for (const auto& [src, is_sd] : {std::pair{tmp.file("sd.trp"), true}, std::pair{tmp.file("t0.trp"), false}}) {
    const auto good = read_all(src);
    for (std::size_t len = 0; len < good.size(); ++len) {
      write_all(path, std::vector<char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(len)));
      CAPTURE(len, is_sd);
      if (is_sd) require_corrupt(path, [&] { load_state_dict_file(path); });
      else require_corrupt(path, [&] { load_tensor(path); });
    }
  }
}

TEST_CASE("wrong magic, wrong version, wrong kind and trailing bytes are named in the error",
          "[tensors][serialization]") {
  temp_dir tmp;
  const std::string path = tmp.file("t.trp");
  save_tensor(arange_int32(4, {4}), path);
  const auto good = read_all(path);
  auto expect_message = [&](std::vector<char> bytes, const std::string& text, bool as_sd = false) {
    write_all(path, bytes);
    try {
      if (as_sd) load_state_dict_file(path);
      else load_tensor(path);
      FAIL("no error");
    } catch (const error& e) {
      CHECK(e.code() == errc::checkpoint_corrupt);
      CHECK_THAT(e.message(), Catch::Contains(path) && Catch::Contains(text));
    }
  };
  auto bad = good;
  bad[0] = 'X';
  expect_message(bad, "magic");
  bad = good;
  bad[8] = 2;  // version 2
  expect_message(bad, "version 2");
  expect_message(good, "expected a state dict", true);
  bad = good;
  bad.push_back('\0');
  expect_message(bad, "trailing");
}

TEST_CASE("loading a missing file is an io_error naming the path", "[tensors][serialization]") {
  temp_dir tmp;
  const std::string path = tmp.file("missing.trp");
  try {
    load_tensor(path);
    FAIL("no error");
  } catch (const error& e) {
    CHECK(e.code() == errc::io_error);
    CHECK_THAT(e.message(), Catch::Contains(path));
  }
}

TEST_CASE("atomic_write_file keeps the old file when the writer throws midway", "[tensors][serialization]") {
  temp_dir tmp;
  const std::string path = tmp.file("ckpt.trp");
  save_tensor(arange_int32(8, {8}), path);
  const auto before = read_all(path);
  CHECK_THROWS_WITH(atomic_write_file(path, [](std::ostream& out) {
                      out << std::string(100000, 'z');
                      throw std::runtime_error("writer failed");
                    }),
                    "writer failed");
  CHECK(read_all(path) == before);
  CHECK(std::distance(fs::directory_iterator(tmp.dir), fs::directory_iterator()) == 1);  // no temporary left
  CHECK(int32_values(load_tensor(path)) == std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("atomic_write_file replaces the file and reports an unwritable path as io_error", "[tensors][serialization]") {
  temp_dir tmp;
  const std::string path = tmp.file("f.bin");
  atomic_write_file(path, [](std::ostream& out) { out << "first"; });
  atomic_write_file(path, [](std::ostream& out) { out << "second"; });
  CHECK(std::string(read_all(path).data(), 6) == "second");
  const std::string bad = tmp.file("no/such/dir/f.bin");
  try {
    atomic_write_file(bad, [](std::ostream& out) { out << "x"; });
    FAIL("no error");
  } catch (const error& e) {
    CHECK(e.code() == errc::io_error);
    CHECK_THAT(e.message(), Catch::Contains(bad));
  }
  CHECK_THROWS_AS(save_tensor(tensor(), path), error);
}

TEST_CASE("tensors travel inside a bigger Boost archive beside other values", "[tensors][serialization]") {
  std::stringstream buf;
  const tensor w = tensor_from_bytes(dtype::float64, {8}, special_bytes(dtype::float64)).narrow(0, 0, 4).view({2, 2});
  {
    boost::archive::binary_oarchive ar(buf);
    const std::int64_t step = 77;
    const tensor undefined;
    state_dict sd;
    sd["w"] = w;
    sd["b"] = arange_int32(3, {3});
    ar << step << w << undefined << w.t() << sd;
  }
  boost::archive::binary_iarchive ar(buf);
  bound_tensor_loads(ar, *buf.rdbuf());
  std::int64_t step = 0;
  tensor a, u, b;
  state_dict sd;
  ar >> step >> a >> u >> b >> sd;
  CHECK(step == 77);
  REQUIRE(sd.size() == 2);
  require_same(sd.at("w"), w);
  CHECK(int32_values(sd.at("b")) == std::vector<std::int32_t>{0, 1, 2});
  require_same(a, w);
  CHECK_FALSE(u.defined());
  require_same(b, w.t());
}

TEST_CASE("a corrupted byte count in a Boost archive fails without a huge allocation", "[tensors][serialization]") {
  std::stringstream buf;
  {
    boost::archive::binary_oarchive ar(buf);
    const std::uint8_t version = 1, defined = 1, dt = 6;
    const std::uint32_t rank = 1;
    const std::int64_t size = std::int64_t{1} << 40;  // a terabyte of uint8
    const std::uint64_t nbytes = std::uint64_t{1} << 40, sum = 0;
    ar << version << defined << dt << rank << size << nbytes << sum;
  }
  const std::string bytes = buf.str();
  SECTION("bounded by the stream size") {
    std::istringstream in(bytes);
    boost::archive::binary_iarchive ar(in);
    bound_tensor_loads(ar, *in.rdbuf());
    tensor t;
    try {
      ar >> t;
      FAIL("no error");
    } catch (const error& e) {
      CHECK(e.code() == errc::checkpoint_corrupt);
      CHECK_THAT(e.message(), Catch::Contains("bytes left"));
    }
  }
  SECTION("unbounded: read in chunks until the input ends") {
    std::istringstream in(bytes);
    boost::archive::binary_iarchive ar(in);
    tensor t;
    CHECK_THROWS(ar >> t);
    CHECK_FALSE(t.defined());
  }
}
