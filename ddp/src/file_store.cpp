// The directory-backed rendezvous store.
#include "troupe/ddp/file_store.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "troupe/tensors/error.hpp"

namespace troupe::ddp {

namespace fs = std::filesystem;

file_store::file_store(std::string dir) : dir_(std::move(dir)) {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) throw error(errc::io_error, "file_store: '" + dir_ + "' is not a directory");
}

file_store file_store::make_temp() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/troupe-store-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) throw error(errc::io_error, "file_store: mkdtemp(" + tmpl + ") failed");
  return file_store(tmpl);
}

void file_store::remove_dir() const noexcept {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::string file_store::path_of(const std::string& key) const {
  std::string k = key;
  for (char& c : k)
    if (c == '/') c = '%';
  return dir_ + "/" + k;
}

void file_store::set(const std::string& key, const std::string& value) const {
  const std::string path = path_of(key);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << value;
    if (!out) throw error(errc::io_error, "file_store::set: cannot write " + tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw error(errc::io_error, "file_store::set: rename to " + path + ": " + ec.message());
}

std::string file_store::get(const std::string& key, std::chrono::milliseconds timeout) const {
  const std::string path = path_of(key);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto backoff = std::chrono::microseconds(50);
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::ostringstream s;
      s << in.rdbuf();
      return s.str();
    }
    if (std::chrono::steady_clock::now() >= deadline)
      throw error(errc::timeout, "file_store::get: key '" + key + "' not set within " + std::to_string(timeout.count()) + " ms");
    std::this_thread::sleep_for(backoff);  // bounded poll of the file system, not a synchronisation
    backoff = std::min(backoff * 2, std::chrono::microseconds(2000));
  }
}

void file_store::barrier(const std::string& name, std::int32_t rank, std::int32_t world_size,
                         std::chrono::milliseconds timeout) const {
  set(name + "/" + std::to_string(rank), "1");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (std::int32_t r = 0; r < world_size; ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      get(name + "/" + std::to_string(r), std::max(left, std::chrono::milliseconds(0)));
    } catch (const error&) {
      std::string missing;
      for (std::int32_t k = r; k < world_size; ++k)
        if (!fs::exists(path_of(name + "/" + std::to_string(k)))) missing += (missing.empty() ? "" : ", ") + std::to_string(k);
      throw error(errc::timeout, "file_store::barrier '" + name + "': rank(s) " + missing + " did not arrive within " +
                                     std::to_string(timeout.count()) + " ms");
    }
  }
}

}  // namespace troupe::ddp
