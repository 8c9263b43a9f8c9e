// The .safetensors reader and writer (troupe/tensors/safetensors.hpp).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "tensors/file_test_util.hpp"
#include "troupe/tensors/allocator.hpp"
#include "troupe/tensors/boost_tensor.hpp"
#include "troupe/tensors/safetensors.hpp"

namespace fs = std::filesystem;
using namespace troupe;

namespace {

using test::as_bytes;
using test::tensor_from_bytes;
struct temp_dir : test::temp_dir {
  temp_dir() : test::temp_dir("st") {}
};

std::vector<unsigned char> bytes_of(const tensor& t) {
  const tensor h = detail::host_contiguous(t);
  std::vector<unsigned char> out(h.nbytes());
  if (!out.empty()) std::memcpy(out.data(), h.data_ptr(), out.size());
  return out;
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A file with header `json` (length prefix computed) followed by `data`.
std::string make_file(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>(static_cast<std::uint64_t>(json.size()) >> (8 * i));
  return out + json + data;
}

std::vector<unsigned char> pattern_bytes(dtype t, std::size_t n) {
  std::vector<unsigned char> b(n * element_size(t));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<unsigned char>(i * 37 + 11);
  if (t == dtype::boolean)
    for (auto& x : b) x &= 1;
  return b;
}

}  // namespace

TEST_CASE("a hand-written safetensors file loads with the right values and metadata", "[tensors][safetensors]") {
  temp_dir tmp;
  const std::string path = tmp.file("tiny.safetensors");
  const unsigned char file[] = {
      138, 0, 0, 0, 0, 0, 0, 0,  // header length, little-endian
      '{', '"', '_', '_', 'm', 'e', 't', 'a', 'd', 'a', 't', 'a', '_', '_', '"', ':', '{', '"', 'f', 'o', 'r', 'm', 'a',
      't', '"', ':', '"', 'p', 't', '"', '}', ',', '"', 'a', '"', ':', '{', '"', 'd', 't', 'y', 'p', 'e', '"', ':', '"',
      'F', '3', '2', '"', ',', '"', 's', 'h', 'a', 'p', 'e', '"', ':', '[', '2', ']', ',', '"', 'd', 'a', 't', 'a', '_',
      'o', 'f', 'f', 's', 'e', 't', 's', '"', ':', '[', '0', ',', '8', ']', '}', ',', '"', 'b', '"', ':', '{', '"', 'd',
      't', 'y', 'p', 'e', '"', ':', '"', 'I', '6', '4', '"', ',', '"', 's', 'h', 'a', 'p', 'e', '"', ':', '[', ']', ',',
      '"', 'd', 'a', 't', 'a', '_', 'o', 'f', 'f', 's', 'e', 't', 's', '"', ':', '[', '8', ',', '1', '6', ']', '}', '}',
      0x00, 0x00, 0x80, 0x3f,  // a[0] = 1.0f
      0x00, 0x00, 0x20, 0xc0,  // a[1] = -2.5f
      42, 0, 0, 0, 0, 0, 0, 0,  // b = 42
  };
  REQUIRE(sizeof(file) == 8 + 138 + 16);
  write_all(path, std::string(reinterpret_cast<const char*>(file), sizeof(file)));
  const state_dict sd = load_safetensors(path);
  REQUIRE(sd.size() == 2);
  const tensor& a = sd.at("a");
  CHECK(a.dtype() == dtype::float32);
  CHECK(a.sizes() == shape_t{2});
  CHECK(a.data<float>()[0] == 1.0f);
  CHECK(a.data<float>()[1] == -2.5f);
  const tensor& b = sd.at("b");
  CHECK(b.dtype() == dtype::int64);
  CHECK(b.dim() == 0);
  CHECK(b.data<std::int64_t>()[0] == 42);
  CHECK(load_safetensors_metadata(path) == safetensors_metadata{{"format", "pt"}});
}

TEST_CASE("safetensors round-trips every dtype, views, empty and 0-d tensors and metadata",
          "[tensors][safetensors]") {
  temp_dir tmp;
  const std::string path = tmp.file("rt.safetensors");
  state_dict sd;
  for (int i = 0; i < num_dtypes; ++i) {
    const auto t = static_cast<dtype>(i);
    sd[std::string("w_") + std::string(to_string(t))] = tensor_from_bytes(t, {3, 5}, pattern_bytes(t, 15));
  }
  sd["nan_payloads"] = tensor_from_bytes(dtype::float32, {4}, as_bytes<std::uint32_t>({0x7fc00001, 0xffa12345, 0x80000000, 0x00000001}));
  sd["transposed"] = sd["w_int32"].t();
  sd["empty"] = tensor_from_bytes(dtype::float16, {0, 4}, {});
  sd["scalar"] = tensor_from_bytes(dtype::float64, {}, as_bytes<double>({-0.0}));
  sd["quote\"and\\slash\n"] = tensor_from_bytes(dtype::uint8, {1}, {7});
  const safetensors_metadata meta{{"format", "pt"}, {"note", "ünïcode \"quoted\""}};
  save_safetensors(sd, path, meta);
  const std::string raw = read_all(path);
  std::uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<std::uint64_t>(static_cast<unsigned char>(raw[static_cast<std::size_t>(i)])) << (8 * i);
  CHECK((8 + header_len) % 8 == 0);
  CHECK(raw.substr(8, 2) == "{\"");
  const state_dict got = load_safetensors(path);
  REQUIRE(got.size() == sd.size());
  for (const auto& [name, t] : sd) {
    CAPTURE(name);
    REQUIRE(got.count(name) == 1);
    CHECK(got.at(name).dtype() == t.dtype());
    CHECK(got.at(name).sizes() == t.sizes());
    CHECK(bytes_of(got.at(name)) == bytes_of(t));
  }
  CHECK(load_safetensors_metadata(path) == meta);
}

TEST_CASE("invalid safetensors headers are checkpoint_corrupt naming the file and the problem",
          "[tensors][safetensors]") {
  temp_dir tmp;
  const std::string path = tmp.file("bad.safetensors");
  const std::string d16(16, '\0');
  struct bad_case {
    std::string file;
    std::string problem;
  };
  const auto entry = [](const std::string& name, const std::string& dt, const std::string& shape, int b, int e) {
    return "\"" + name + "\":{\"dtype\":\"" + dt + "\",\"shape\":" + shape + ",\"data_offsets\":[" + std::to_string(b) + "," +
           std::to_string(e) + "]}";
  };
  const auto obj = [](const std::vector<std::string>& parts) {
    std::string out = "{";
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (i) out += ',';
      out += parts[i];
    }
    out += '}';
    return out;
  };
  const std::vector<bad_case> cases = {
      {make_file(obj({entry("a", "F32", "[2]", 0, 8), entry("b", "F32", "[2]", 4, 12)}), std::string(12, '\0')), "overlap"},
      {make_file(obj({entry("a", "F32", "[2]", 0, 8), entry("b", "F32", "[1]", 12, 16)}), d16), "gap"},
      {make_file(obj({entry("a", "F32", "[4]", 0, 16)}), std::string(8, '\0')), "truncated"},
      {make_file(obj({entry("a", "F32", "[2]", 0, 8)}), d16), "trailing"},
      {make_file(obj({entry("a", "F32", "[3]", 0, 16)}), d16), "does not match"},
      {make_file(obj({entry("a", "F32", "[-4]", 0, 16)}), d16), "non-negative"},
      {make_file(obj({entry("a", "F32", "[4]", 16, 0)}), d16), "before begin"},
      {make_file(obj({entry("a", "F99", "[4]", 0, 16)}), d16), "unknown dtype"},
      {make_file(obj({entry("a", "F32", "[4]", 0, 16), entry("a", "F32", "[4]", 0, 16)}), d16), "duplicate key"},
      {make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[4]}}", d16), "needs dtype, shape and data_offsets"},
      {make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16],\"x\":1}}", d16), "unexpected key"},
      {make_file(obj({entry("a", "F32", "[4.5]", 0, 16)}), d16), "non-negative integer"},
      {make_file("{\"a\":[1,2", d16), "JSON"},
      {make_file("[1,2]", ""), "not a JSON object"},
      {make_file("{\"__metadata__\":{\"k\":1}}", ""), "not a string"},
      {make_file(obj({entry("m", "BOOL", "[2]", 0, 2)}), std::string("\x01\x02", 2)), "BOOL"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10), "header length"},
      {std::string("\x02\x00\x00", 3), "truncated"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.problem);
    write_all(path, c.file);
    try {
      load_safetensors(path);
      FAIL("no error for a file with: " << c.problem);
    } catch (const error& e) {
      CHECK(e.code() == errc::checkpoint_corrupt);
      CHECK_THAT(e.message(), Catch::Contains(path) && Catch::Contains(c.problem));
    }
  }
}

TEST_CASE("a safetensors dtype without a Troupe dtype is not_supported", "[tensors][safetensors]") {
  temp_dir tmp;
  const std::string path = tmp.file("i16.safetensors");
  write_all(path, make_file("{\"a\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[0,4]}}", std::string(4, '\0')));
  try {
    load_safetensors(path);
    FAIL("no error");
  } catch (const error& e) {
    CHECK(e.code() == errc::not_supported);
    CHECK_THAT(e.message(), Catch::Contains("I16") && Catch::Contains(path));
  }
}

TEST_CASE("every truncation and byte flip of a safetensors file either loads or throws troupe::error",
          "[tensors][safetensors]") {
  temp_dir tmp;
  const std::string path = tmp.file("f.safetensors");
  state_dict sd;
  sd["x"] = tensor_from_bytes(dtype::int32, {2, 2}, pattern_bytes(dtype::int32, 4));
  sd["y"] = tensor_from_bytes(dtype::boolean, {3}, {1, 0, 1});
  save_safetensors(sd, path, {{"k", "v"}});
  const std::string good = read_all(path);
  for (std::size_t len = 0; len < good.size(); ++len) {
    write_all(path, good.substr(0, len));
    CAPTURE(len);
    CHECK_THROWS_AS(load_safetensors(path), error);
  }
  for (std::size_t i = 0; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    write_all(path, bad);
    CAPTURE(i);
    // safetensors has no checksum. A flip in the data or inside a name or metadata string can
    // load, but the structure must still be the one written. Anything else is a troupe::error.
    state_dict got;
    bool loaded = false;
    try {
      got = load_safetensors(path);
      loaded = true;
    } catch (const error&) {
    }
    if (loaded) CHECK(got.size() == 2);
  }
}

TEST_CASE("save_safetensors rejects undefined tensors and the reserved name", "[tensors][safetensors]") {
  temp_dir tmp;
  state_dict sd;
  sd["__metadata__"] = tensor_from_bytes(dtype::uint8, {1}, {1});
  CHECK_THROWS_AS(save_safetensors(sd, tmp.file("a.safetensors")), error);
  state_dict sd2;
  sd2["u"] = tensor();
  try {
    save_safetensors(sd2, tmp.file("b.safetensors"));
    FAIL("no error");
  } catch (const error& e) {
    CHECK(e.code() == errc::bad_argument);
  }
  CHECK_FALSE(fs::exists(tmp.file("a.safetensors")));
}
