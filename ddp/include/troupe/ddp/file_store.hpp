#pragma once
/// \file file_store.hpp
/// A rendezvous store in a directory of the local file system, for process groups whose ranks
/// share one host and have no runtime node (tests, benchmarks, single-host examples). Keys are
/// files written atomically (write + rename); waits poll with a short backoff up to a deadline.
/// The runtime's store (`node::store()`) is the one for jobs with nodes.

#include <chrono>
#include <cstdint>
#include <string>

namespace troupe::ddp {

/// Key/value rendezvous in `dir`. Copyable (it is only a path); thread- and process-safe.
class file_store {
 public:
  /// Uses the existing directory `dir` (io_error if it does not exist).
  explicit file_store(std::string dir);
  /// Creates a fresh private directory under $TMPDIR or /tmp (io_error on failure). Create it
  /// before spawning the ranks and remove it with remove_dir() after they joined.
  static file_store make_temp();
  /// Removes the directory and everything in it. Never throws.
  void remove_dir() const noexcept;

  /// Sets `key` to `value` atomically.
  void set(const std::string& key, const std::string& value) const;
  /// The value of `key`, waiting up to `timeout` (errc::timeout naming the key).
  std::string get(const std::string& key, std::chrono::milliseconds timeout) const;
  /// Blocks until `world_size` ranks called barrier(name); errc::timeout names the missing ranks.
  void barrier(const std::string& name, std::int32_t rank, std::int32_t world_size, std::chrono::milliseconds timeout) const;
  const std::string& dir() const noexcept { return dir_; }

 private:
  std::string path_of(const std::string& key) const;
  std::string dir_;
};

}  // namespace troupe::ddp
