#pragma once
// Helpers shared by the file-format tests (serialization_test.cpp, safetensors_test.cpp):
// a scratch directory and tensors built from raw bytes without any op, so those tests check the
// file code alone.

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <system_error>
#include <vector>

#include "troupe/tensors/allocator.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe::test {

/// A fresh directory for one test, removed afterwards.
struct temp_dir {
  std::filesystem::path dir;
  explicit temp_dir(const std::string& tag = "files") {
    std::random_device rd;
    dir = std::filesystem::temp_directory_path() /
          ("troupe-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(dir);
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  std::string file(const std::string& name) const { return (dir / name).string(); }
};

/// A contiguous CPU tensor holding exactly `bytes`.
inline tensor tensor_from_bytes(dtype t, shape_t shape, const std::vector<unsigned char>& bytes) {
  auto impl = std::make_shared<tensor_impl>();
  impl->storage = storage::make(bytes.size(), cpu_allocator());
  if (!bytes.empty()) std::memcpy(impl->storage->data(), bytes.data(), bytes.size());
  impl->strides = contiguous_strides(shape);
  impl->sizes = std::move(shape);
  impl->dtype = t;
  return tensor(std::move(impl));
}

/// The bytes of a vector of words.
template <class Word>
std::vector<unsigned char> as_bytes(const std::vector<Word>& words) {
  std::vector<unsigned char> out(words.size() * sizeof(Word));
  if (!out.empty()) std::memcpy(out.data(), words.data(), out.size());
  return out;
}

}  // namespace troupe::test
