#pragma once
/// \file serialization.hpp
/// Tensor and state-dict files, and the atomic file write used by every checkpoint.
///
/// Note [Tensor file format]
/// A file is a fixed 40-byte little-endian header followed by a Boost binary archive (the
/// payload):
///
///     offset  0  magic "TRPTENS\0"              (8 bytes)
///     offset  8  format version (1)              u32
///     offset 12  kind (1 tensor, 2 state dict)   u32
///     offset 16  payload length in bytes         u64   (file size must be 40 + this)
///     offset 24  checksum64 of the payload       u64
///     offset 32  checksum64 of bytes 0..31       u64
///     offset 40  payload: Boost binary archive
///
/// Per tensor the archive holds a record version, dtype, rank, sizes, byte count, checksum64 of
/// the bytes, then the bytes as one binary blob (boost_tensor.hpp). A state dict is an entry
/// count, then (name length, name bytes, tensor) per entry, names strictly increasing. Readers
/// check, in order: size >= header, magic, version, header checksum, kind, payload length, payload
/// checksum; then every length in the archive against the bytes left before allocating. Any
/// failure is errc::checkpoint_corrupt "<path>: <what was wrong>"; a file is never half-read
/// into a silently wrong tensor.

#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

#include "troupe/tensors/state_dict.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe {

/// Format version written by this build (the only one it reads).
inline constexpr std::uint32_t tensor_file_version = 1;

/// Writes `t` to `path` atomically (see atomic_write_file). CUDA tensors are copied to the host
/// first; non-contiguous tensors are written contiguously. Blocks until the file is durable.
/// Errors: io_error naming the path; invalid_state for an undefined tensor.
void save_tensor(const tensor& t, const std::string& path);

/// Reads a tensor written by save_tensor; the result is a contiguous CPU tensor. Blocks.
/// Errors: io_error when the file cannot be opened; checkpoint_corrupt "<path>: <what>" when it
/// is truncated, corrupted, of another version or not a tensor file.
tensor load_tensor(const std::string& path);

/// Writes every tensor of `sd` to `path` atomically. Blocks. Errors: as save_tensor.
void save_state_dict(const state_dict& sd, const std::string& path);

/// Reads a state dict written by save_state_dict (CPU tensors). Blocks. Errors: as load_tensor.
state_dict load_state_dict_file(const std::string& path);

/// Writes a file atomically: writes `path.tmp.<pid>`, fsyncs it, renames over `path`, fsyncs the
/// directory. `write` fills the stream. On any failure the old file is untouched and the
/// temporary is removed; I/O failures throw io_error naming the path, an exception thrown by
/// `write` itself propagates unchanged. Blocks on the calling thread.
void atomic_write_file(const std::string& path, const std::function<void(std::ostream&)>& write);

}  // namespace troupe
