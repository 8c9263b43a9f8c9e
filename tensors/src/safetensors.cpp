// .safetensors reading and writing (troupe/tensors/safetensors.hpp).
#include "troupe/tensors/safetensors.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string_view>
#include <vector>

#include "safetensors_json.hpp"
#include "troupe/tensors/boost_tensor.hpp"
#include "troupe/tensors/serialization.hpp"

namespace troupe {

namespace {

namespace json = detail::json;

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

constexpr std::uint64_t max_header_bytes = std::uint64_t{100} << 20;
constexpr std::array<std::pair<std::string_view, dtype>, 8> dtype_codes = {{
    {"F32", dtype::float32}, {"F64", dtype::float64}, {"F16", dtype::float16}, {"BF16", dtype::bfloat16},
    {"I32", dtype::int32}, {"I64", dtype::int64}, {"U8", dtype::uint8}, {"BOOL", dtype::boolean}}};
constexpr std::array<std::string_view, 9> unsupported_codes = {"F8_E4M3", "F8_E5M2", "I8", "I16", "U16",
                                                               "U32", "U64", "F8_E8M0", "F4"};

std::string_view code_of(dtype t) {
  for (const auto& [code, d] : dtype_codes)
    if (d == t) return code;
  return "?";
}

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw error(errc::checkpoint_corrupt, path + ": " + what);
}

struct entry {
  std::string name;
  dtype type = dtype::float32;
  shape_t shape;
  std::uint64_t begin = 0, end = 0;
};

struct parsed_file {
  std::vector<entry> entries;
  safetensors_metadata metadata;
  std::uint64_t data_start = 0;
  std::ifstream in;
};

dtype parse_dtype(const std::string& path, const entry& e, const json::value& v) {
  if (v.k != json::value::kind::string) corrupt(path, "tensor \"" + e.name + "\": dtype is not a string");
  for (const auto& [code, d] : dtype_codes)
    if (code == v.text) return d;
  if (std::find(unsupported_codes.begin(), unsupported_codes.end(), v.text) != unsupported_codes.end())
    throw error(errc::not_supported, path + ": tensor \"" + e.name + "\": safetensors dtype " + v.text + " has no Troupe dtype");
  corrupt(path, "tensor \"" + e.name + "\": unknown dtype \"" + v.text + "\"");
}

entry parse_entry(const std::string& path, std::string name, const json::value& v) {
  entry e;
  e.name = std::move(name);
  const std::string what = "tensor \"" + e.name + "\"";
  if (v.k != json::value::kind::object) corrupt(path, what + ": entry is not an object");
  bool has_dtype = false, has_shape = false, has_offsets = false;
  for (const auto& [key, val] : v.members) {
    if (key == "dtype") {
      e.type = parse_dtype(path, e, val);
      has_dtype = true;
    } else if (key == "shape") {
      if (val.k != json::value::kind::array || val.items.size() > detail::max_tensor_rank) corrupt(path, what + ": shape is not an array of at most 64 sizes");
      for (const auto& s : val.items) e.shape.push_back(static_cast<std::int64_t>(json::to_uint(s, what + ": a size")));
      has_shape = true;
    } else if (key == "data_offsets") {
      if (val.k != json::value::kind::array || val.items.size() != 2) corrupt(path, what + ": data_offsets is not [begin, end]");
      e.begin = json::to_uint(val.items[0], what + ": data_offsets begin");
      e.end = json::to_uint(val.items[1], what + ": data_offsets end");
      has_offsets = true;
    } else {
      corrupt(path, what + ": unexpected key \"" + key + "\"");
    }
  }
  if (!has_dtype || !has_shape || !has_offsets) corrupt(path, what + ": needs dtype, shape and data_offsets");
  if (e.end < e.begin) corrupt(path, what + ": data_offsets end " + std::to_string(e.end) + " before begin " + std::to_string(e.begin));
  detail::tensor_record r;
  r.dtype = static_cast<std::uint8_t>(e.type);
  r.sizes = e.shape;
  r.nbytes = e.end - e.begin;
  try {
    detail::check_record_sizes(r, std::nullopt);
  } catch (const error& err) {
    corrupt(path, what + ": " + err.message());
  }
  return e;
}

safetensors_metadata parse_metadata(const std::string& path, const json::value& v) {
  if (v.k != json::value::kind::object) corrupt(path, "__metadata__ is not an object");
  safetensors_metadata out;
  for (const auto& [key, val] : v.members) {
    if (val.k != json::value::kind::string) corrupt(path, "__metadata__ value of \"" + key + "\" is not a string");
    out.emplace(key, val.text);
  }
  return out;
}

// Entries sorted by offset must tile the data section exactly.
void check_layout(const std::string& path, std::vector<entry>& entries, std::uint64_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const entry& a, const entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  for (const auto& e : entries) {
    if (e.begin != at)
      corrupt(path, "tensor \"" + e.name + "\": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                        ") " + (e.begin < at ? "overlap the previous tensor" : "leave a gap") + " (expected begin " + std::to_string(at) + ")");
    at = e.end;
  }
  if (at != data_size)
    corrupt(path, "data section holds " + std::to_string(data_size) + " bytes but the tensors cover " + std::to_string(at) +
                      (at > data_size ? " (file truncated)" : " (trailing bytes)"));
}

parsed_file open_file(const std::string& path) {
  parsed_file f;
  f.in.open(path, std::ios::binary);
  if (!f.in) throw error(errc::io_error, path + ": cannot open for reading: " + std::strerror(errno));
  f.in.seekg(0, std::ios::end);
  const auto size = static_cast<std::uint64_t>(static_cast<std::streamoff>(f.in.tellg()));
  f.in.seekg(0);
  if (size < 8) corrupt(path, "truncated: " + std::to_string(size) + " bytes, no room for the 8-byte header length");
  std::array<unsigned char, 8> len_bytes{};
  f.in.read(reinterpret_cast<char*>(len_bytes.data()), 8);
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<std::uint64_t>(len_bytes[static_cast<std::size_t>(i)]) << (8 * i);
  if (n < 2 || n > max_header_bytes || n > size - 8)
    corrupt(path, "header length " + std::to_string(n) + " is invalid for a file of " + std::to_string(size) + " bytes");
  std::string header(static_cast<std::size_t>(n), '\0');
  if (!f.in.read(header.data(), static_cast<std::streamsize>(n))) throw error(errc::io_error, path + ": read of the header failed");
  json::value doc;
  try {
    doc = json::parse(header);
  } catch (const error& e) {
    corrupt(path, e.message());
  }
  if (doc.k != json::value::kind::object) corrupt(path, "header is not a JSON object");
  try {
    for (const auto& [key, val] : doc.members) {
      if (key == "__metadata__") f.metadata = parse_metadata(path, val);
      else f.entries.push_back(parse_entry(path, key, val));
    }
  } catch (const error& e) {
    if (e.message().rfind(path + ": ", 0) == 0) throw;
    throw error(e.code(), path + ": " + e.message());  // from the JSON number conversion
  }
  f.data_start = 8 + n;
  check_layout(path, f.entries, size - f.data_start);
  return f;
}

tensor read_entry(const std::string& path, parsed_file& f, const entry& e) {
  detail::tensor_record r;
  r.dtype = static_cast<std::uint8_t>(e.type);
  r.sizes = e.shape;
  r.nbytes = e.end - e.begin;
  tensor t = detail::allocate_for_record(r);
  if (r.nbytes == 0) return t;
  f.in.seekg(static_cast<std::streamoff>(f.data_start + e.begin));
  if (!f.in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(r.nbytes)))
    throw error(errc::io_error, path + ": read of tensor \"" + e.name + "\" failed");
  if (e.type == dtype::boolean) {
    const auto* b = static_cast<const unsigned char*>(t.data_ptr());
    if (std::any_of(b, b + r.nbytes, [](unsigned char c) { return c > 1; }))
      corrupt(path, "tensor \"" + e.name + "\": BOOL byte other than 0 or 1");
  }
  return t;
}

std::string header_json(const std::vector<std::pair<std::string, tensor>>& items, const safetensors_metadata& metadata) {
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) h += ',';
      h += json::quote(k);
      h += ':';
      h += json::quote(v);
      first = false;
    }
    h += "}";
  }
  std::uint64_t at = 0;
  for (const auto& [name, t] : items) {
    if (h.size() > 1) h += ",";
    h += json::quote(name) + ":{\"dtype\":\"" + std::string(code_of(t.dtype())) + "\",\"shape\":[";
    for (std::size_t i = 0; i < t.sizes().size(); ++i) {
      if (i) h += ',';
      h += std::to_string(t.sizes()[i]);
    }
    h += "],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + t.nbytes()) + "]}";
    at += t.nbytes();
  }
  h += "}";
  while ((h.size() + 8) % 8 != 0) h += ' ';
  return h;
}

}  // namespace

void save_safetensors(const state_dict& sd, const std::string& path, const safetensors_metadata& metadata) {
  std::vector<std::pair<std::string, tensor>> items;
  for (const auto& [name, t] : sd) {
    if (name == "__metadata__") throw error(errc::bad_argument, "save_safetensors: a tensor may not be named __metadata__ (" + path + ")");
    if (!t.defined()) throw error(errc::bad_argument, "save_safetensors: tensor \"" + name + "\" is undefined (" + path + ")");
    items.emplace_back(name, detail::host_contiguous(t));
  }
  const std::string header = header_json(items, metadata);
  atomic_write_file(path, [&](std::ostream& out) {
    std::array<char, 8> len{};
    for (int i = 0; i < 8; ++i) len[static_cast<std::size_t>(i)] = static_cast<char>(static_cast<std::uint64_t>(header.size()) >> (8 * i));
    out.write(len.data(), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const auto& [name, t] : items)
      if (t.nbytes() > 0) out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.nbytes()));
  });
}

state_dict load_safetensors(const std::string& path) {
  parsed_file f = open_file(path);
  state_dict sd;
  for (const auto& e : f.entries) sd.emplace(e.name, read_entry(path, f, e));
  return sd;
}

safetensors_metadata load_safetensors_metadata(const std::string& path) { return open_file(path).metadata; }

}  // namespace troupe
