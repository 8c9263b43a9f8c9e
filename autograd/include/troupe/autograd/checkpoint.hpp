#pragma once
/// \file checkpoint.hpp
/// Training checkpoints: model parameters and buffers, optimizer state, the step counter and a
/// generator's state, in one file that is written atomically and verified when read.
///
/// Note [Checkpoint file]
/// ----------------------
///   offset 0   magic    8 bytes  "TRPCKPT\0"
///          8   version  u32 LE   (checkpoint_format_version)
///         12   length   u64 LE   payload bytes
///         20   checksum u64 LE   FNV-1a 64 of the payload
///         28   payload           Boost binary archive: model state_dict, optimizer state_dict,
///                                step (int64), generator seed and offset (uint64)
/// Guarantees: the file is written to a temporary, fsynced and renamed over `path`
/// (atomic_write_file), so a crash or an exception while saving leaves the previous checkpoint
/// in place. Reading checks magic, version, length and checksum before the archive is parsed.
/// So a truncated or bit-flipped file is rejected with checkpoint_corrupt, never half-loaded.
/// The model and optimizer are only touched after the whole file decoded.

#include <cstdint>
#include <string>
#include <string_view>

#include "troupe/autograd/nn/module.hpp"
#include "troupe/autograd/optim/optimizer.hpp"
#include "troupe/tensors/generator.hpp"

namespace troupe {

/// Version written into new checkpoints; readers reject any other.
inline constexpr std::uint32_t checkpoint_format_version = 1;

/// The decoded content of a checkpoint file.
struct checkpoint_state {
  troupe::state_dict model;
  troupe::state_dict optimizer;
  std::int64_t step = 0;
  generator gen;
};

/// Encodes `st` into the bytes of a checkpoint file (Note [Checkpoint file]). Blocks; CUDA
/// tensors are copied to the host.
std::string encode_checkpoint(const checkpoint_state& st);
/// Decodes checkpoint bytes; `source` names the file in errors. Throws checkpoint_corrupt
/// ("<source>: <what was wrong>") for a bad magic, version, length, checksum or archive.
checkpoint_state decode_checkpoint(std::string_view bytes, const std::string& source);

/// Saves model.state_dict(), opt.state_dict(), `step` and `gen` to `path` atomically. Blocks
/// until the file is durable. Throws io_error naming the path when it cannot be written (the
/// previous file, if any, is then unchanged).
void save_checkpoint(const std::string& path, const nn::module& model, const optim::optimizer& opt,
                     std::int64_t step, const generator& gen);

/// Loads a checkpoint written by save_checkpoint into `model` (strict), `opt` and `gen`, and
/// returns the saved step. Throws io_error when the file cannot be read, checkpoint_corrupt when
/// it is damaged, and load_state_dict's errors (shape_mismatch, dtype_mismatch, bad_argument)
/// when it does not fit the model or optimizer. On any error the model, optimizer and generator
/// are left as they were.
std::int64_t load_checkpoint(const std::string& path, nn::module& model, optim::optimizer& opt, generator& gen);

}  // namespace troupe
