// The JSON reader and writer of the .safetensors header (see safetensors_json.hpp).
#include "safetensors_json.hpp"

#include <unordered_set>

#include "troupe/tensors/error.hpp"

namespace troupe::detail::json {

namespace {

constexpr int max_depth = 64;

class parser {
 public:
  explicit parser(std::string_view s) : s_(s) {}

  value document() {
    value v = parse_value(0);
    skip_ws();
    if (pos_ != s_.size()) fail("unexpected data after the top-level value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw error(errc::checkpoint_corrupt, "JSON header: " + what + " at byte " + std::to_string(pos_));
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  char peek() {
    skip_ws();
    if (pos_ >= s_.size()) fail("unexpected end");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  void literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) fail("invalid literal");
    pos_ += word.size();
  }

  value parse_value(int depth) {
    if (depth > max_depth) fail("nesting deeper than " + std::to_string(max_depth));
    value v;
    const char c = peek();
    if (c == '{') parse_object(v, depth);
    else if (c == '[') parse_array(v, depth);
    else if (c == '"') { v.k = value::kind::string; v.text = parse_string(); }
    else if (c == 't') { literal("true"); v.k = value::kind::boolean; v.boolean = true; }
    else if (c == 'f') { literal("false"); v.k = value::kind::boolean; }
    else if (c == 'n') { literal("null"); }
    else { v.k = value::kind::number; v.text = parse_number(); }
    return v;
  }

  void parse_object(value& v, int depth) {
    v.k = value::kind::object;
    expect('{');
    if (peek() == '}') { ++pos_; return; }
    std::unordered_set<std::string> keys;  // a linear search made a large header quadratic
    for (;;) {
      if (peek() != '"') fail("expected a string key");
      std::string key = parse_string();
      if (!keys.insert(key).second) fail("duplicate key \"" + key + "\"");
      expect(':');
      v.members.push_back(member{std::move(key), parse_value(depth + 1)});
      if (peek() == ',') { ++pos_; continue; }
      expect('}');
      return;
    }
  }

  void parse_array(value& v, int depth) {
    v.k = value::kind::array;
    expect('[');
    if (peek() == ']') { ++pos_; return; }
    for (;;) {
      v.items.push_back(parse_value(depth + 1));
      if (peek() == ',') { ++pos_; continue; }
      expect(']');
      return;
    }
  }

  std::string parse_number() {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t d = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
      if (pos_ == d) fail("invalid number");
    };
    if (pos_ < s_.size() && s_[pos_] == '-') ++pos_;
    if (pos_ < s_.size() && s_[pos_] == '0') ++pos_;
    else digits();
    if (pos_ < s_.size() && s_[pos_] == '.') { ++pos_; digits(); }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) ++pos_;
      digits();
    }
    return std::string(s_.substr(start, pos_ - start));
  }

  unsigned hex4() {
    if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else fail("invalid \\u escape");
    }
    return v;
  }

  static void append_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) { out += static_cast<char>(cp); return; }
    if (cp < 0x800) { out += static_cast<char>(0xC0 | (cp >> 6)); }
    else if (cp < 0x10000) { out += static_cast<char>(0xE0 | (cp >> 12)); out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F)); }
    else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    }
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }

  void escape(std::string& out) {
    if (pos_ >= s_.size()) fail("truncated escape");
    const char e = s_[pos_++];
    switch (e) {
      case '"': out += '"'; return;
      case '\\': out += '\\'; return;
      case '/': out += '/'; return;
      case 'b': out += '\b'; return;
      case 'f': out += '\f'; return;
      case 'n': out += '\n'; return;
      case 'r': out += '\r'; return;
      case 't': out += '\t'; return;
      case 'u': break;
      default: fail("invalid escape");
    }
    unsigned cp = hex4();
    if (cp >= 0xD800 && cp < 0xDC00) {  // high surrogate: a low one must follow
      if (s_.substr(pos_, 2) != "\\u") fail("unpaired surrogate");
      pos_ += 2;
      const unsigned lo = hex4();
      if (lo < 0xDC00 || lo >= 0xE000) fail("unpaired surrogate");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    } else if (cp >= 0xDC00 && cp < 0xE000) {
      fail("unpaired surrogate");
    }
    append_utf8(out, cp);
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) fail("unterminated string");
      const char c = s_[pos_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
      if (c == '\\') escape(out);
      else out += c;
    }
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

}  // namespace

value parse(std::string_view text) { return parser(text).document(); }

std::uint64_t to_uint(const value& v, const std::string& what) {
  if (v.k != value::kind::number || v.text.empty() || v.text.size() > 19)
    throw error(errc::checkpoint_corrupt, what + " is not a non-negative integer");
  std::uint64_t out = 0;
  for (const char c : v.text) {
    if (c < '0' || c > '9') throw error(errc::checkpoint_corrupt, what + " is not a non-negative integer (" + v.text + ")");
    out = out * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (out > static_cast<std::uint64_t>(INT64_MAX)) throw error(errc::checkpoint_corrupt, what + " is out of range (" + v.text + ")");
  return out;
}

std::string quote(std::string_view s) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (u < 0x20) { out += "\\u00"; out += hex[u >> 4]; out += hex[u & 15]; }
    else out += c;
  }
  return out + "\"";
}

}  // namespace troupe::detail::json
