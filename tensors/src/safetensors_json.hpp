#pragma once
// Private: the small JSON reader and writer behind the .safetensors header. Strict RFC 8259
// syntax, a nesting limit, duplicate keys rejected; numbers are kept as their text so integers
// are converted exactly.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::detail::json {

struct member;

/// One parsed JSON value.
struct value {
  enum class kind : std::uint8_t { null, boolean, number, string, array, object };
  kind k = kind::null;
  bool boolean = false;
  /// The decoded string, or a number's text.
  std::string text;
  std::vector<value> items;
  /// Members in document order (keys unique).
  std::vector<member> members;
};

/// One member of an object: its key and its value.
struct member {
  std::string key;
  value val;
};

/// Parses a complete document (trailing whitespace allowed). Throws
/// troupe::error(checkpoint_corrupt, "JSON header: <what> at byte N").
value parse(std::string_view text);

/// The non-negative integer a number holds; throws checkpoint_corrupt naming `what` when the
/// value is not a number, not an integer, negative, or beyond 2^63 - 1.
std::uint64_t to_uint(const value& v, const std::string& what);

/// `s` as a quoted JSON string (escaping quotes, backslashes and control characters).
std::string quote(std::string_view s);

}  // namespace troupe::detail::json
