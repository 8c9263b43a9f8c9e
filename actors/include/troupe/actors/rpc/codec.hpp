#pragma once
/// \file codec.hpp
/// The RPC argument/result codec: a Boost.Serialization binary archive into a std::vector<char>
/// (CAF then copies the bytes raw; no float ever goes through CAF's inspection).
///
/// Note [rpc payload]
/// An argument list is encoded as: u32 count, then per argument its type tag (a string such as
/// "int32", "vector<float64>", "tensor") followed by its value. The callee reads the count and
/// each tag before the value and compares them with the registered signature, so a mismatch is
/// reported as bad_argument naming the argument index, the expected and the received type.
/// Values: arithmetic types and strings as Boost writes them (raw bytes); vectors of arithmetic
/// types as one binary blob; vectors, maps, pairs and tuples element-wise; tensors as
/// kind (0 = inline bytes; 1 = the name of a shared-memory segment, between processes of one host,
/// see Note [tensor over shared memory] in src/rpc/bulk.hpp), dtype, rank, sizes, bytes of
/// the contiguous CPU tensor; anything else through its Boost `serialize` (user structs; a tensor
/// inside a user struct uses troupe/tensors/boost_tensor.hpp).

#include <cstdint>
#include <cstring>
#include <map>
#include <streambuf>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/serialization/string.hpp>

#include "troupe/tensors/boost_tensor.hpp"
#include "troupe/tensors/error.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe::rpc {

namespace detail {

/// Appends to a byte vector.
class vector_sink : public std::streambuf {
 public:
  explicit vector_sink(std::vector<char>& out) : out_(out) {}

 protected:
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    out_.insert(out_.end(), s, s + n);
    return n;
  }
  int_type overflow(int_type c) override {
    if (c != traits_type::eof()) out_.push_back(static_cast<char>(c));
    return c;
  }

 private:
  std::vector<char>& out_;
};

/// Reads from a byte range.
class span_source : public std::streambuf {
 public:
  span_source(const char* data, std::size_t n) {
    char* p = const_cast<char*>(data);
    setg(p, p, p + n);
  }
};

/// The demangled C++ name of a type (the tag of user structs).
std::string demangle(const char* mangled);

template <class T> struct is_vector : std::false_type {};
template <class T, class A> struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T> struct is_map : std::false_type {};
template <class K, class V, class C, class A> struct is_map<std::map<K, V, C, A>> : std::true_type {};
template <class T> struct is_tuple : std::false_type {};
template <class... Ts> struct is_tuple<std::tuple<Ts...>> : std::true_type {};
template <class A, class B> struct is_tuple<std::pair<A, B>> : std::true_type {};

}  // namespace detail

/// The wire type tag of T (Note [rpc payload]).
template <class T>
std::string type_tag();

namespace detail {
template <class... Ts>
std::string join_tags() {
  std::string out;
  ((out += (out.empty() ? "" : ",") + type_tag<Ts>()), ...);
  return out;
}
template <class T> struct tag_of { static std::string get() { return demangle(typeid(T).name()); } };
template <> struct tag_of<bool> { static std::string get() { return "bool"; } };
template <> struct tag_of<char> { static std::string get() { return "char"; } };
template <> struct tag_of<std::int8_t> { static std::string get() { return "int8"; } };
template <> struct tag_of<std::uint8_t> { static std::string get() { return "uint8"; } };
template <> struct tag_of<std::int16_t> { static std::string get() { return "int16"; } };
template <> struct tag_of<std::uint16_t> { static std::string get() { return "uint16"; } };
template <> struct tag_of<std::int32_t> { static std::string get() { return "int32"; } };
template <> struct tag_of<std::uint32_t> { static std::string get() { return "uint32"; } };
template <> struct tag_of<long> { static std::string get() { return "int64"; } };
template <> struct tag_of<unsigned long> { static std::string get() { return "uint64"; } };
template <> struct tag_of<long long> { static std::string get() { return "int64"; } };
template <> struct tag_of<unsigned long long> { static std::string get() { return "uint64"; } };
template <> struct tag_of<float> { static std::string get() { return "float32"; } };
template <> struct tag_of<double> { static std::string get() { return "float64"; } };
template <> struct tag_of<std::string> { static std::string get() { return "string"; } };
template <> struct tag_of<tensor> { static std::string get() { return "tensor"; } };
template <class T, class A> struct tag_of<std::vector<T, A>> {
  static std::string get() { return "vector<" + type_tag<T>() + ">"; }
};
template <class K, class V, class C, class A> struct tag_of<std::map<K, V, C, A>> {
  static std::string get() { return "map<" + type_tag<K>() + "," + type_tag<V>() + ">"; }
};
template <class... Ts> struct tag_of<std::tuple<Ts...>> {
  static std::string get() { return "tuple<" + join_tags<Ts...>() + ">"; }
};
template <class A, class B> struct tag_of<std::pair<A, B>> {
  static std::string get() { return "pair<" + join_tags<A, B>() + ">"; }
};
}  // namespace detail

template <class T>
std::string type_tag() {
  return detail::tag_of<std::decay_t<T>>::get();
}

namespace detail {

using oarchive = boost::archive::binary_oarchive;
using iarchive = boost::archive::binary_iarchive;
inline constexpr unsigned archive_flags = boost::archive::no_header | boost::archive::no_codecvt;

/// Writes a tensor inline (kind 0): dtype, rank, sizes, raw bytes of its contiguous CPU copy.
void write_tensor(oarchive& ar, const tensor& t);
/// Reads a tensor written by write_tensor into a new contiguous CPU tensor.
tensor read_tensor(iarchive& ar);

template <class T> void write_value(oarchive& ar, const T& x);
template <class T> void read_value(iarchive& ar, T& x);

template <class T>
void write_value(oarchive& ar, const T& x) {
  if constexpr (std::is_same_v<T, tensor>) {
    write_tensor(ar, x);
  } else if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, std::string>) {
    ar << x;
  } else if constexpr (is_vector<T>::value) {
    const std::uint64_t n = x.size();
    ar << n;
    using E = typename T::value_type;
    if constexpr (std::is_arithmetic_v<E> && !std::is_same_v<E, bool>) {
      if (n > 0) ar.save_binary(x.data(), n * sizeof(E));
    } else {
      for (const auto& e : x) write_value(ar, static_cast<const E&>(e));
    }
  } else if constexpr (is_map<T>::value) {
    const std::uint64_t n = x.size();
    ar << n;
    for (const auto& [k, v] : x) {
      write_value(ar, k);
      write_value(ar, v);
    }
  } else if constexpr (is_tuple<T>::value) {
    std::apply([&](const auto&... e) { (write_value(ar, e), ...); }, x);
  } else {
    ar << x;  // a user struct with a Boost serialize()
  }
}

template <class T>
void read_value(iarchive& ar, T& x) {
  if constexpr (std::is_same_v<T, tensor>) {
    x = read_tensor(ar);
  } else if constexpr (std::is_arithmetic_v<T> || std::is_same_v<T, std::string>) {
    ar >> x;
  } else if constexpr (is_vector<T>::value) {
    std::uint64_t n = 0;
    ar >> n;
    using E = typename T::value_type;
    if constexpr (std::is_arithmetic_v<E> && !std::is_same_v<E, bool>) {
      x.resize(n);
      if (n > 0) ar.load_binary(x.data(), n * sizeof(E));
    } else {
      x.clear();
      for (std::uint64_t i = 0; i < n; ++i) {
        E e{};
        read_value(ar, e);
        x.push_back(std::move(e));
      }
    }
  } else if constexpr (is_map<T>::value) {
    std::uint64_t n = 0;
    ar >> n;
    x.clear();
    for (std::uint64_t i = 0; i < n; ++i) {
      typename T::key_type k{};
      typename T::mapped_type v{};
      read_value(ar, k);
      read_value(ar, v);
      x.emplace(std::move(k), std::move(v));
    }
  } else if constexpr (is_tuple<T>::value) {
    std::apply([&](auto&... e) { (read_value(ar, e), ...); }, x);
  } else {
    ar >> x;
  }
}

}  // namespace detail

/// Encodes an argument list (Note [rpc payload]).
template <class... Args>
std::vector<char> encode_args(const Args&... args) {
  std::vector<char> out;
  detail::vector_sink sink(out);
  detail::oarchive ar(sink, detail::archive_flags);
  const std::uint32_t n = sizeof...(Args);
  ar << n;
  ((ar << type_tag<Args>(), detail::write_value(ar, args)), ...);
  return out;
}

/// Encodes one result value (no tag: the caller chose R).
template <class R>
std::vector<char> encode_result(const R& r) {
  std::vector<char> out;
  detail::vector_sink sink(out);
  detail::oarchive ar(sink, detail::archive_flags);
  detail::write_value(ar, r);
  return out;
}

/// Decodes one result value. Throws troupe::error(protocol_violation) on malformed bytes.
template <class R>
R decode_result(const std::vector<char>& bytes, const std::string& what) {
  R r{};
  try {
    detail::span_source src(bytes.data(), bytes.size());
    detail::iarchive ar(src, detail::archive_flags);
    detail::read_value(ar, r);
  } catch (const troupe::error&) {
    throw;
  } catch (const std::exception& e) {
    throw error(errc::protocol_violation, what + ": cannot decode the result as " + type_tag<R>() + ": " + e.what());
  }
  return r;
}

/// Decodes an argument list into a tuple after checking count and tags against Args.
/// Throws troupe::error(bad_argument) naming the argument index, expected and received type.
template <class... Args>
std::tuple<std::decay_t<Args>...> decode_args(const std::vector<char>& bytes, const std::string& fn) {
  std::tuple<std::decay_t<Args>...> out;
  detail::span_source src(bytes.data(), bytes.size());
  try {
    detail::iarchive ar(src, detail::archive_flags);
    std::uint32_t n = 0;
    ar >> n;
    if (n != sizeof...(Args))
      throw error(errc::bad_argument, "function '" + fn + "' takes " + std::to_string(sizeof...(Args)) +
                                          " argument(s), got " + std::to_string(n));
    std::size_t index = 0;
    auto one = [&](auto& slot) {
      using T = std::decay_t<decltype(slot)>;
      std::string tag;
      ar >> tag;
      if (tag != type_tag<T>())
        throw error(errc::bad_argument, "function '" + fn + "' argument " + std::to_string(index) + ": expected " +
                                            type_tag<T>() + ", got " + tag);
      detail::read_value(ar, slot);
      ++index;
    };
    std::apply([&](auto&... slots) { (one(slots), ...); }, out);
  } catch (const troupe::error&) {
    throw;
  } catch (const std::exception& e) {
    throw error(errc::bad_argument, "function '" + fn + "': malformed argument payload: " + e.what());
  }
  return out;
}

}  // namespace troupe::rpc
