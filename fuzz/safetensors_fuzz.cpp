// Harness: .safetensors files (troupe/tensors/safetensors.hpp) and the JSON reader of their
// header (tensors/src/safetensors_json.hpp).
// Input: a selector byte (0: the bytes are a JSON document; 1: a file read by load_safetensors;
// 2: by load_safetensors_metadata), then the bytes.
// Beyond "no crash": every string of a parsed document reads back the same once quoted.
#include <string_view>

#include "fuzz_input.hpp"
#include "safetensors_json.hpp"
#include "troupe/tensors/safetensors.hpp"

namespace {

namespace json = troupe::detail::json;

void check_strings(const json::value& v) {
  if (v.k == json::value::kind::string) {
    const json::value back = json::parse(json::quote(v.text));
    troupe::fuzz::require(back.k == json::value::kind::string && back.text == v.text, "quote() does not read back");
  }
  for (const auto& item : v.items) check_strings(item);
  for (const auto& m : v.members) {
    check_strings(json::value{json::value::kind::string, false, m.key, {}, {}});
    check_strings(m.val);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const auto* bytes = data + 1;
  const std::size_t n = size - 1;
  switch (data[0] % 3) {
    case 0:
    {
      json::value doc;
      bool parsed = false;
      troupe::fuzz::refused_ok([&] {
        doc = json::parse(std::string_view(reinterpret_cast<const char*>(bytes), n));
        parsed = true;
      });
      if (parsed) check_strings(doc);  // outside refused_ok: a quoted string must parse
      break;
    }
    case 1: {
      troupe::fuzz::memory_file file(bytes, n);
      troupe::fuzz::refused_ok([&] {
        for (const auto& [name, t] : troupe::load_safetensors(file.path())) (void)t.sum();
      });
      break;
    }
    default: {
      troupe::fuzz::memory_file file(bytes, n);
      troupe::fuzz::refused_ok([&] { (void)troupe::load_safetensors_metadata(file.path()); });
    }
  }
  return 0;
}
