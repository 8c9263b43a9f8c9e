// Tensor and state-dict files (Note [Tensor file format] in serialization.hpp) and the atomic
// file write.
#include "troupe/tensors/serialization.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <boost/archive/archive_exception.hpp>
#include <boost/archive/binary_oarchive.hpp>

#include "checksum.hpp"
#include "troupe/tensors/boost_tensor.hpp"
#include "troupe/tensors/bounded_archive.hpp"

namespace troupe {

namespace {

constexpr std::array<char, 8> file_magic = {'T', 'R', 'P', 'T', 'E', 'N', 'S', '\0'};
constexpr std::size_t header_size = 40;
enum class file_kind : std::uint32_t { tensor = 1, state_dict = 2 };

const char* kind_name(std::uint32_t k) {
  switch (k) {
    case 1: return "tensor";
    case 2: return "state dict";
    default: return "unknown";
  }
}

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw error(errc::checkpoint_corrupt, path + ": " + what);
}

[[noreturn]] void io_failure(const std::string& path, const std::string& what, int err) {
  throw error(errc::io_error, path + ": " + what + ": " + std::strerror(err));
}

void put_u32(char* p, std::uint32_t v) { for (int i = 0; i < 4; ++i) p[i] = static_cast<char>(v >> (8 * i)); }
void put_u64(char* p, std::uint64_t v) { for (int i = 0; i < 8; ++i) p[i] = static_cast<char>(v >> (8 * i)); }
std::uint32_t get_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
std::uint64_t get_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

// fsync of a file or directory by name.
void fsync_path(const std::string& name, int flags, const std::string& path) {
  const int fd = ::open(name.c_str(), flags | O_CLOEXEC);
  if (fd < 0) io_failure(path, "cannot open " + name + " to sync it", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) io_failure(path, "fsync of " + name + " failed", err);
}

// Writes header + payload atomically.
void write_file(const std::string& path, file_kind kind, const std::string& payload) {
  std::array<char, header_size> h{};
  std::memcpy(h.data(), file_magic.data(), file_magic.size());
  put_u32(h.data() + 8, tensor_file_version);
  put_u32(h.data() + 12, static_cast<std::uint32_t>(kind));
  put_u64(h.data() + 16, payload.size());
  put_u64(h.data() + 24, detail::checksum64(payload.data(), payload.size()));
  put_u64(h.data() + 32, detail::checksum64(h.data(), 32));
  atomic_write_file(path, [&](std::ostream& out) {
    out.write(h.data(), static_cast<std::streamsize>(h.size()));
    out.write(payload.data(), static_cast<std::streamsize>(payload.size()));
  });
}

// Reads the file, validates its header and payload checksum, returns the payload.
std::string read_payload(const std::string& path, file_kind kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) io_failure(path, "cannot open for reading", errno);
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::uint64_t>(static_cast<std::streamoff>(in.tellg()));
  in.seekg(0);
  if (size < header_size)
    corrupt(path, "truncated: " + std::to_string(size) + " bytes, shorter than the " + std::to_string(header_size) + "-byte header");
  std::array<char, header_size> h{};
  if (!in.read(h.data(), header_size)) io_failure(path, "read of the header failed", errno);
  if (std::memcmp(h.data(), file_magic.data(), file_magic.size()) != 0) corrupt(path, "wrong magic: not a Troupe tensor file");
  const std::uint32_t version = get_u32(h.data() + 8);
  if (version != tensor_file_version)
    corrupt(path, "unsupported format version " + std::to_string(version) + " (this build reads version " +
                      std::to_string(tensor_file_version) + ")");
  if (get_u64(h.data() + 32) != detail::checksum64(h.data(), 32)) corrupt(path, "header checksum mismatch (header corrupted)");
  const std::uint32_t got_kind = get_u32(h.data() + 12);
  if (got_kind != static_cast<std::uint32_t>(kind))
    corrupt(path, std::string("is a ") + kind_name(got_kind) + " file, expected a " + kind_name(static_cast<std::uint32_t>(kind)) + " file");
  const std::uint64_t len = get_u64(h.data() + 16);
  if (len != size - header_size)
    corrupt(path, (len > size - header_size ? "truncated: header announces " : "trailing data: header announces ") +
                      std::to_string(len) + " payload bytes, file holds " + std::to_string(size - header_size));
  std::string payload(static_cast<std::size_t>(len), '\0');
  if (!in.read(payload.data(), static_cast<std::streamsize>(len))) io_failure(path, "read of the payload failed", errno);
  if (detail::checksum64(payload.data(), payload.size()) != get_u64(h.data() + 24))
    corrupt(path, "payload checksum mismatch (data corrupted)");
  return payload;
}

// Runs `parse` over the payload as a bounded binary archive, turning every failure into
// checkpoint_corrupt naming the file, and checks that the archive used every byte.
template <class Fn>
void parse_payload(const std::string& path, std::string payload, Fn&& parse) {
  const std::uint64_t len = payload.size();
  try {
    std::istringstream in(std::move(payload), std::ios::binary);
    bounded_iarchive ar(*in.rdbuf(), 0, errc::checkpoint_corrupt, path);  // Note [bounded archive]
    parse(ar);
    const auto pos = static_cast<std::uint64_t>(static_cast<std::streamoff>(in.tellg()));
    if (pos != len) corrupt(path, std::to_string(len - pos) + " unread bytes after the archive");
  } catch (const error& e) {
    if (e.code() == errc::checkpoint_corrupt && e.message().rfind(path + ": ", 0) == 0) throw;
    throw error(e.code() == errc::io_error ? errc::io_error : errc::checkpoint_corrupt, path + ": " + e.message());
  } catch (const boost::archive::archive_exception& e) {
    corrupt(path, std::string("archive error: ") + e.what());
  } catch (const std::exception& e) {
    corrupt(path, std::string("cannot decode: ") + e.what());
  }
}

template <class Fn>
std::string build_payload(Fn&& fill) {
  std::ostringstream out(std::ios::binary);
  {
    boost::archive::binary_oarchive ar(out);
    fill(ar);
  }
  return std::move(out).str();
}

}  // namespace

void atomic_write_file(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) io_failure(path, "cannot create " + tmp, errno);
    try {
      write(out);
    } catch (...) {
      out.close();
      ::unlink(tmp.c_str());
      throw;
    }
    out.close();
    if (out.fail()) {
      const int err = errno;
      ::unlink(tmp.c_str());
      io_failure(path, "writing " + tmp + " failed", err);
    }
  }
  try {
    fsync_path(tmp, O_RDONLY, path);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    io_failure(path, "rename of " + tmp + " failed", err);
  }
  std::string dir = std::filesystem::path(path).parent_path().string();
  fsync_path(dir.empty() ? "." : dir, O_RDONLY | O_DIRECTORY, path);
}

void save_tensor(const tensor& t, const std::string& path) {
  if (!t.defined()) throw error(errc::invalid_state, "save_tensor: undefined tensor (" + path + ")");
  write_file(path, file_kind::tensor, build_payload([&](auto& ar) { ar << t; }));
}

tensor load_tensor(const std::string& path) {
  tensor t;
  parse_payload(path, read_payload(path, file_kind::tensor), [&](auto& ar) { ar >> t; });
  if (!t.defined()) corrupt(path, "holds an undefined tensor");
  return t;
}

void save_state_dict(const state_dict& sd, const std::string& path) {
  write_file(path, file_kind::state_dict, build_payload([&](auto& ar) {
               const std::uint64_t count = sd.size();
               ar << count;
               for (const auto& [name, t] : sd) {
                 const std::uint64_t len = name.size();
                 ar << len;
                 if (len > 0) ar << boost::serialization::make_binary_object(const_cast<char*>(name.data()), len);
                 ar << t;
               }
             }));
}

state_dict load_state_dict_file(const std::string& path) {
  state_dict sd;
  parse_payload(path, read_payload(path, file_kind::state_dict), [&](auto& ar) {
    std::uint64_t count = 0;
    ar >> count;
    for (std::uint64_t i = 0; i < count; ++i) {
      std::uint64_t len = 0;
      ar >> len;
      const auto left = ar.template get_helper<detail::archive_input_bound>().remaining();
      if (left && len > *left) corrupt(path, "entry " + std::to_string(i) + ": name length " + std::to_string(len) + " exceeds the file");
      std::string name(static_cast<std::size_t>(len), '\0');
      if (len > 0) ar >> boost::serialization::make_binary_object(name.data(), len);
      if (!sd.empty() && !(sd.rbegin()->first < name))
        corrupt(path, "entry names out of order or duplicated at \"" + name + "\"");
      tensor t;
      ar >> t;
      sd.emplace_hint(sd.end(), std::move(name), std::move(t));
    }
  });
  return sd;
}

}  // namespace troupe
