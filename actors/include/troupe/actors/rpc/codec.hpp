#pragma once
/// \file codec.hpp
/// The RPC argument/result codec: raw native bytes into a std::vector<char>. CAF and the direct
/// channel copy them raw; no float ever goes through CAF's inspection. User structs go through a
/// Boost.Serialization binary archive opened only for them. Opening an archive builds a
/// std::locale, a large user-space cost for a small call.
///
/// Note [rpc payload]
/// An argument list is encoded as: u32 count, then per argument its type tag and its value.
/// A tag is a string such as "int32", "vector<float64>", "tensor".
/// The callee reads the count and each tag before the value and compares them with the
/// registered signature. A mismatch is reported as bad_argument naming the argument index, the
/// expected and the received type.
/// Values:
///   * arithmetic types: their native bytes;
///   * strings: a u64 length and the bytes;
///   * vectors of arithmetic types: a u64 count and one binary blob;
///   * vectors, maps, pairs and tuples: element-wise;
///   * tensors: kind, dtype, rank, sizes, bytes of the contiguous CPU tensor;
///   * a handle type (an RRef): it writes and reads itself (self_coded);
///   * anything else: its Boost `serialize` (user structs), read by a bounded_iarchive
///     (Note [bounded archive]). A tensor inside a user struct uses
///     troupe/tensors/boost_tensor.hpp.
/// A tensor's kind says where its bytes are:
///   * 0: inline bytes;
///   * 1: the name of a shared-memory segment, between processes of one host;
///     see Note [tensor over shared memory] in src/rpc/bulk.hpp;
///   * 3: inline bytes for a CUDA device of the receiver, with its index;
///   * 4: inline bytes of a result from a CUDA device of the sender, with its index;
///   * 5: a CUDA IPC handle for a device of the receiver.
/// Kinds 3 to 5 follow Note [rpc device map] in device_map.hpp.
/// A result is encoded as its type tag and its value. Its tag is a u16 length and the bytes of
/// the same string. A void function's result is empty. The caller compares the tag in place
/// with the tag of the R it asked for. A mismatch is bad_argument naming both types. This costs
/// a few bytes and one compare per result, no allocation.
/// Decoding is bounded. Every count and length is checked against the bytes left before
/// anything is allocated. A bool is the byte 0 or 1. A tensor's shape must have a byte count
/// that fits an int64 and equals the announced one. Bytes left over after a result or the last
/// argument are an error.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <ios>
#include <map>
#include <memory>
#include <stdexcept>
#include <streambuf>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <boost/archive/binary_oarchive.hpp>
#include <boost/serialization/string.hpp>

#include "troupe/actors/rpc/codec_context.hpp"
#include "troupe/tensors/boost_tensor.hpp"
#include "troupe/tensors/bounded_archive.hpp"
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

/// Reads from a byte range; seekable, so a bounded_iarchive can measure what is left.
class span_source : public std::streambuf {
 public:
  span_source(const char* data, std::size_t n) {
    char* p = const_cast<char*>(data);
    setg(p, p, p + n);
  }
  /// Bytes read so far.
  std::size_t consumed() const { return static_cast<std::size_t>(gptr() - eback()); }

 protected:
  pos_type seekoff(off_type off, std::ios_base::seekdir dir, std::ios_base::openmode which) override {
    const off_type size = egptr() - eback();
    const off_type at = off + (dir == std::ios_base::beg ? 0 : dir == std::ios_base::cur ? gptr() - eback() : size);
    if (!(which & std::ios_base::in) || at < 0 || at > size) return pos_type(off_type(-1));
    setg(eback(), eback() + at, egptr());
    return pos_type(at);
  }
  pos_type seekpos(pos_type pos, std::ios_base::openmode which) override {
    return seekoff(off_type(pos), std::ios_base::beg, which);
  }
};

/// Blocks at least this large may take their room from the node's pooled payload buffers.
inline constexpr std::size_t pooled_block_bytes = std::size_t{4} << 20;
/// Gives `out` room for `need` bytes from the byte pool of the context's node, if any (Note [byte
/// pool] in src/rpc/byte_pool.hpp); otherwise does nothing.
void reserve_from_pool(const codec_context& ctx, std::vector<char>& out, std::size_t need);

/// Appends raw bytes to a payload, under a codec context (Note [codec context]).
class writer {
 public:
  explicit writer(std::vector<char>& out, const codec_context& ctx = plain_context) : out_(out), ctx_(ctx) {}
  void raw(const void* p, std::size_t n) {
    const auto* c = static_cast<const char*>(p);
    if (n <= 64) {  // small fixed-size fields: resize + memcpy (GCC 12 warns falsely about insert here)
      const auto at = out_.size();
      out_.resize(at + n);
      if (n > 0) std::memcpy(out_.data() + at, c, n);
    } else {
      if (n >= pooled_block_bytes && out_.capacity() - out_.size() < n) reserve_from_pool(ctx_, out_, out_.size() + n);
      out_.insert(out_.end(), c, c + n);  // no zero-fill of large blocks
    }
  }
  template <class T> void pod(const T& x) { raw(&x, sizeof x); }
  void str(const std::string& x) {
    pod(static_cast<std::uint64_t>(x.size()));
    raw(x.data(), x.size());
  }
  std::vector<char>& buffer() { return out_; }
  const codec_context& context() const { return ctx_; }

 private:
  std::vector<char>& out_;
  const codec_context& ctx_;
};

/// Reads raw bytes of a payload, under a codec context (Note [codec context]); throws
/// std::out_of_range when it ends too early.
class reader {
 public:
  reader(const char* p, std::size_t n, const codec_context& ctx = plain_context) : p_(p), end_(p + n), ctx_(ctx) {}
  void raw(void* dst, std::size_t n) {
    if (n > left()) throw std::out_of_range("the payload ends early");
    if (n > 0) std::memcpy(dst, p_, n);
    p_ += n;
  }
  template <class T> void pod(T& x) { raw(&x, sizeof x); }
  /// A bool: the byte 0 or 1, anything else is a protocol violation (Note [rpc payload]).
  void boolean(bool& x) {
    std::uint8_t b = 0;
    raw(&b, 1);
    if (b > 1) throw error(errc::protocol_violation, "a bool holds the byte " + std::to_string(b) + " (only 0 and 1 are bools)");
    x = b == 1;
  }
  /// Reads a u64 length and its bytes in place; the view lives as long as the payload.
  std::string_view view() {
    std::uint64_t n = 0;
    pod(n);
    if (n > left()) throw std::out_of_range("the payload ends early");
    std::string_view v(p_, n);
    p_ += n;
    return v;
  }
  void str(std::string& x) {
    std::uint64_t n = 0;
    pod(n);
    if (n > left()) throw std::out_of_range("the payload ends early");
    x.assign(p_, n);
    p_ += n;
  }
  std::size_t left() const { return static_cast<std::size_t>(end_ - p_); }
  const char* pos() const { return p_; }
  void skip(std::size_t n) {
    if (n > left()) throw std::out_of_range("the payload ends early");
    p_ += n;
  }
  const codec_context& context() const { return ctx_; }

 private:
  const char* p_;
  const char* end_;
  const codec_context& ctx_;
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

/// The wire type tag of T (Note [rpc payload]); built once per type.
template <class T>
const std::string& type_tag();

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
const std::string& type_tag() {
  static const std::string tag = detail::tag_of<std::decay_t<T>>::get();
  return tag;
}

namespace detail {

using oarchive = boost::archive::binary_oarchive;
inline constexpr unsigned archive_flags = boost::archive::no_header | boost::archive::no_codecvt;

/// Writes a tensor inline (kind 0): dtype, rank, sizes, byte count, then padding to a 64-byte
/// offset of the buffer. Then come the raw bytes of its contiguous CPU copy. It goes over shared
/// memory (kinds 1, 2) when the writer's context allows that for its peer.
/// See Note [tensor over shared memory].
/// Under the context's device scope, a CUDA tensor is written as kind 3 (or 5, by IPC handle)
/// for the mapped device. Otherwise it throws device_mismatch naming its device and the peer.
/// In a served call's answer it is written as kind 4 with its own device
/// (Note [rpc device map]).
void write_tensor(writer& w, const tensor& t);
/// Reads a tensor written by write_tensor into a new contiguous CPU tensor, or one that views the
/// payload itself (the context's keeper, Note [adopted payload]). Kinds 3 and 5 give a tensor on
/// the mapped CUDA device; device_mismatch when this process does not have it. Kind 4 gives a
/// tensor on the device the context's result_devices maps the sender's device to;
/// device_mismatch naming it when there is none.
tensor read_tensor(reader& r);

/// Where CUDA results (kind 4) of a call come back to. `reverse` is the inverse of the caller's
/// device map for `peer`. It gives the local device for the sender's device
/// (Note [rpc device map]). Both references must outlive it. A codec_context points to it while
/// a result is decoded.
class result_devices {
 public:
  result_devices(const std::map<int, int>& reverse, const std::string& peer) : reverse_(reverse), peer_(peer) {}
  result_devices(const result_devices&) = delete;
  result_devices& operator=(const result_devices&) = delete;
  /// The local CUDA device for the peer's device `remote`: device_mismatch naming it and the
  /// peer when the map has no entry.
  troupe::device local_of(int remote) const;

 private:
  const std::map<int, int>& reverse_;
  const std::string& peer_;
};

/// Note [adopted payload]
/// A large tensor sent as inline bytes is not copied out of the received payload. Inline bytes
/// are used between hosts, or without shared memory. A copy would cost one full copy per
/// direction on top of the kernel's.
/// A decode's codec context may have a payload_keeper. Then some inline tensors become tensors
/// VIEWING the keeper's buffer. Such a tensor has at least adopt_min_bytes, is read from that
/// buffer, and sits at a 16-byte aligned address. The writer pads its data to a 64-byte offset of
/// the buffer for this. The view's storage keeps the keeper's owner alive.
/// The owner holds the payload's bytes and nothing else: no request, call state, connection or
/// node part. So a kept tensor pins no node resource and makes no cycle through a function or a
/// continuation. The owner gives the buffer back to the byte pool when the last tensor viewing
/// it goes (Note [byte pool]). It does so only if the node still exists. The keepers:
///   * the served request (direct channel, served once; a fault plan's copies of one request
///     decode their own): the job keeps an empty holder. If a tensor viewed the payload, the
///     payload (the same heap block) moves into the holder when the function returns;
///   * a call's response of adopt_min_bytes or more: call_state keeps it in a shared holder from
///     the start. future::get decodes it without an interceptor. With one, the decoded result
///     is stored in the call state: copied.
/// A tensor keeping a payload keeps the payload's whole buffer. So a tensor is adopted only
/// when it fills at least half of the buffer's capacity. Then a received tensor that a callee
/// or a caller stores never pins more than twice its own bytes. A pooled buffer may be up to
/// four times larger than the message (Note [byte pool]), and a payload may carry several
/// tensors. Anything else is copied: smaller parts of a payload, bytes outside the keeper's
/// buffer, and tensors under adopt_min_bytes. So are nested payloads decoded with a context of
/// their own.
inline constexpr std::size_t adopt_min_bytes = std::size_t{64} << 10;

class payload_keeper {
 public:
  /// Tensors read from `bytes` may view it and hold `owner`. The owner keeps the bytes alive
  /// after the keeper is gone, and no one writes to them any more. A null owner adopts nothing.
  payload_keeper(const std::vector<char>& bytes, std::shared_ptr<const void> owner)
      : begin_(bytes.data()), end_(bytes.data() + bytes.size()), capacity_(bytes.capacity()), owner_(std::move(owner)) {}
  payload_keeper(const payload_keeper&) = delete;
  payload_keeper& operator=(const payload_keeper&) = delete;
  /// Whether tensors at [p, p + n) may view the buffer (it holds them and the owner is set).
  bool holds(const char* p, std::size_t n) const {
    return owner_ && begin_ && p >= begin_ && p <= end_ && n <= static_cast<std::size_t>(end_ - p);
  }
  const std::shared_ptr<const void>& owner() const { return owner_; }
  /// The capacity of the buffer a viewing tensor keeps alive.
  std::size_t capacity() const { return capacity_; }

 private:
  const char* begin_;
  const char* end_;
  std::size_t capacity_;
  std::shared_ptr<const void> owner_;
};

template <class T> void write_value(writer& w, const T& x);
template <class T> void read_value(reader& r, T& x);

/// A value that writes and reads itself with the codec's writer and reader, so it sees their
/// codec context. A handle type such as an RRef is one (Note [codec context]).
template <class T>
concept self_coded = requires(const T& c, T& m, writer& w, reader& r) {
  c.write_payload(w);
  m.read_payload(r);
};

template <class T>
void write_value(writer& w, const T& x) {
  if constexpr (std::is_same_v<T, tensor>) {
    write_tensor(w, x);
  } else if constexpr (std::is_arithmetic_v<T>) {
    w.pod(x);
  } else if constexpr (std::is_same_v<T, std::string>) {
    w.str(x);
  } else if constexpr (is_vector<T>::value) {
    const std::uint64_t n = x.size();
    w.pod(n);
    using E = typename T::value_type;
    if constexpr (std::is_arithmetic_v<E> && !std::is_same_v<E, bool>) {
      w.raw(x.data(), n * sizeof(E));
    } else {
      for (const auto& e : x) write_value(w, static_cast<const E&>(e));
    }
  } else if constexpr (is_map<T>::value) {
    w.pod(static_cast<std::uint64_t>(x.size()));
    for (const auto& [k, v] : x) {
      write_value(w, k);
      write_value(w, v);
    }
  } else if constexpr (is_tuple<T>::value) {
    std::apply([&](const auto&... e) { (write_value(w, e), ...); }, x);
  } else if constexpr (self_coded<T>) {
    x.write_payload(w);
  } else {  // a user struct with a Boost serialize(): an archive of its own, appended in place
    vector_sink sink(w.buffer());
    oarchive ar(sink, archive_flags);
    ar << x;
  }
}

template <class T>
void read_value(reader& r, T& x) {
  if constexpr (std::is_same_v<T, tensor>) {
    x = read_tensor(r);
  } else if constexpr (std::is_same_v<T, bool>) {
    r.boolean(x);
  } else if constexpr (std::is_arithmetic_v<T>) {
    r.pod(x);
  } else if constexpr (std::is_same_v<T, std::string>) {
    r.str(x);
  } else if constexpr (is_vector<T>::value) {
    std::uint64_t n = 0;
    r.pod(n);
    using E = typename T::value_type;
    if constexpr (std::is_arithmetic_v<E> && !std::is_same_v<E, bool>) {
      if (n > r.left() / sizeof(E)) throw std::out_of_range("the payload ends early");
      x.resize(n);
      r.raw(x.data(), n * sizeof(E));
    } else {
      if (n > r.left()) throw std::out_of_range("the payload ends early");  // every element takes a byte at least
      x.clear();
      for (std::uint64_t i = 0; i < n; ++i) {
        E e{};
        read_value(r, e);
        x.push_back(std::move(e));
      }
    }
  } else if constexpr (is_map<T>::value) {
    std::uint64_t n = 0;
    r.pod(n);
    if (n > r.left()) throw std::out_of_range("the payload ends early");
    x.clear();
    for (std::uint64_t i = 0; i < n; ++i) {
      typename T::key_type k{};
      typename T::mapped_type v{};
      read_value(r, k);
      read_value(r, v);
      x.emplace(std::move(k), std::move(v));
    }
  } else if constexpr (is_tuple<T>::value) {
    std::apply([&](auto&... e) { (read_value(r, e), ...); }, x);
  } else if constexpr (self_coded<T>) {
    x.read_payload(r);
  } else {  // Note [bounded archive]: no length in it allocates more than the payload holds
    span_source src(r.pos(), r.left());
    try {
      bounded_iarchive ar(src, archive_flags, errc::protocol_violation, "a " + type_tag<T>() + " in an rpc payload");
      ar >> x;
    } catch (const troupe::error& e) {  // a tensor record inside reports checkpoint_corrupt
      if (e.code() != errc::checkpoint_corrupt) throw;
      throw error(errc::protocol_violation, "a " + type_tag<T>() + " in an rpc payload: " + e.message());
    }
    r.skip(src.consumed());
  }
}

}  // namespace detail

/// Encodes an argument list (Note [rpc payload]) under `ctx` (Note [codec context]).
template <class... Args>
std::vector<char> encode_args(const codec_context& ctx, const Args&... args) {
  std::vector<char> out;
  detail::writer w(out, ctx);
  w.pod(static_cast<std::uint32_t>(sizeof...(Args)));
  ((w.str(type_tag<Args>()), detail::write_value(w, args)), ...);
  return out;
}
/// Encodes an argument list under the plain context.
template <class... Args>
std::vector<char> encode_args(const Args&... args) {
  return encode_args<Args...>(plain_context, args...);
}

namespace detail {
/// Writes a result's tag: its length as a u16, then its bytes (Note [rpc payload]).
inline void write_result_tag(writer& w, const std::string& tag) {
  const auto n = static_cast<std::uint16_t>(std::min<std::size_t>(tag.size(), 0xffff));
  w.pod(n);
  w.raw(tag.data(), n);
}
/// Reads a result's tag in place.
inline std::string_view read_result_tag(reader& r) {
  std::uint16_t n = 0;
  r.pod(n);
  if (n > r.left()) throw std::out_of_range("the payload ends early");
  std::string_view tag(r.pos(), n);
  r.skip(n);
  return tag;
}
/// The tag of T as written in a result (at most 65535 bytes of it).
template <class T>
std::string_view result_tag() {
  const std::string& t = type_tag<T>();
  return std::string_view(t).substr(0, 0xffff);
}
}  // namespace detail

/// Encodes one result value after its type tag (Note [rpc payload]) under `ctx`.
template <class R>
std::vector<char> encode_result(const codec_context& ctx, const R& r) {
  std::vector<char> out;
  const std::string& tag = type_tag<R>();
  // One allocation for a scalar result, as without the tag.
  out.reserve(sizeof(std::uint16_t) + tag.size() + (std::is_arithmetic_v<R> ? sizeof(R) : 16));
  detail::writer w(out, ctx);
  detail::write_result_tag(w, tag);
  detail::write_value(w, r);
  return out;
}
/// Encodes one result value under the plain context.
template <class R>
std::vector<char> encode_result(const R& r) {
  return encode_result<R>(plain_context, r);
}

namespace detail {
inline std::string describe(const std::string& what) { return what; }
inline std::string describe(const char* what) { return what; }
template <class F>
  requires std::is_invocable_r_v<std::string, const F&>
std::string describe(const F& what) {
  return what();
}
}  // namespace detail

/// Decodes one result value. Throws troupe::error(bad_argument) naming both types when the
/// result is not an R; an empty result is a void function's. Throws protocol_violation on
/// malformed bytes or bytes left over after the value. Messages start with `what`: a string,
/// or a callable that makes it (only then). Decoded under `ctx` (Note [codec context]).
template <class R, class What>
R decode_result(const codec_context& ctx, const std::vector<char>& bytes, const What& what) {
  R r{};
  try {
    if (bytes.empty())
      throw error(errc::bad_argument, detail::describe(what) + ": expected a result of type " + type_tag<R>() +
                                          ", got no value (the function returns void)");
    detail::reader in(bytes.data(), bytes.size(), ctx);
    const std::string_view tag = detail::read_result_tag(in);
    if (tag != detail::result_tag<R>())
      throw error(errc::bad_argument, detail::describe(what) + ": expected a result of type " + type_tag<R>() + ", got " +
                                          std::string(tag));
    detail::read_value(in, r);
    if (in.left() != 0)
      throw error(errc::protocol_violation, detail::describe(what) + ": " + std::to_string(in.left()) +
                                                " bytes left over after the " + type_tag<R>() + " result");
  } catch (const troupe::error&) {
    throw;
  } catch (const std::exception& e) {
    throw error(errc::protocol_violation, detail::describe(what) + ": cannot decode the result as " + type_tag<R>() + ": " + e.what());
  }
  return r;
}
/// Decodes one result value under the plain context.
template <class R, class What>
R decode_result(const std::vector<char>& bytes, const What& what) {
  return decode_result<R>(plain_context, bytes, what);
}

/// Decodes an argument list into a tuple after checking count and tags against Args.
/// Throws troupe::error(bad_argument) naming the argument index, expected and received type.
/// It also throws bad_argument when bytes are left over after the last argument.
/// Throws protocol_violation when a value's bytes break the codec: a bool other than 0 or 1, a
/// length beyond the payload, a bad tensor header. Decoded under `ctx` (Note [codec context]).
template <class... Args>
std::tuple<std::decay_t<Args>...> decode_args(const codec_context& ctx, const std::vector<char>& bytes, const std::string& fn) {
  std::tuple<std::decay_t<Args>...> out;
  detail::reader in(bytes.data(), bytes.size(), ctx);
  try {
    std::uint32_t n = 0;
    in.pod(n);
    if (n != sizeof...(Args))
      throw error(errc::bad_argument, "function '" + fn + "' takes " + std::to_string(sizeof...(Args)) +
                                          " argument(s), got " + std::to_string(n));
    std::size_t index = 0;
    auto one = [&](auto& slot) {
      using T = std::decay_t<decltype(slot)>;
      const std::string_view tag = in.view();  // compared in place: no allocation per argument
      if (tag != type_tag<T>())
        throw error(errc::bad_argument, "function '" + fn + "' argument " + std::to_string(index) + ": expected " +
                                            type_tag<T>() + ", got " + std::string(tag));
      detail::read_value(in, slot);
      ++index;
    };
    std::apply([&](auto&... slots) { (one(slots), ...); }, out);
    if (in.left() != 0)
      throw error(errc::bad_argument, "function '" + fn + "': " + std::to_string(in.left()) +
                                          " bytes left over after the last argument");
  } catch (const troupe::error&) {
    throw;
  } catch (const std::exception& e) {
    throw error(errc::bad_argument, "function '" + fn + "': malformed argument payload: " + e.what());
  }
  return out;
}
/// Decodes an argument list under the plain context.
template <class... Args>
std::tuple<std::decay_t<Args>...> decode_args(const std::vector<char>& bytes, const std::string& fn) {
  return decode_args<Args...>(plain_context, bytes, fn);
}

}  // namespace troupe::rpc
