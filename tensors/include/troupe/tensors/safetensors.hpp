#pragma once
/// \file safetensors.hpp
/// Reading and writing the `.safetensors` format. A file holds, in order:
/// - an 8-byte little-endian header length N;
/// - an N-byte JSON header `{"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin,
///   end]}, ..., "__metadata__": {"key": "value"}}`;
/// - the raw little-endian bytes; offsets are relative to the start of the data.
/// Supported dtype codes: F32 F64 F16 BF16 I32 I64 U8 BOOL.

#include <map>
#include <string>

#include "troupe/tensors/state_dict.hpp"

namespace troupe {

/// String-to-string metadata stored under "__metadata__".
using safetensors_metadata = std::map<std::string, std::string>;

/// Writes `sd` (any devices, any layouts; written contiguous, in name order, header padded to
/// 8 bytes) and `metadata` to `path` atomically (atomic_write_file). Blocks.
/// Errors: bad_argument for an undefined tensor or a tensor named "__metadata__"; io_error.
void save_safetensors(const state_dict& sd, const std::string& path, const safetensors_metadata& metadata = {});

/// Reads every tensor of a .safetensors file as contiguous CPU tensors. Blocks.
/// Validates the header length, the JSON, every entry and bool bytes. An entry needs a valid
/// dtype, a shape, and offsets in range. The entries are contiguous and non-overlapping and
/// cover the whole data section. Each entry's shape x dtype size equals its byte span.
/// Errors: io_error when the file cannot be read;
/// checkpoint_corrupt "<path>: <what>" for an invalid file; not_supported for a valid dtype
/// code Troupe has no dtype for (F8_E4M3, I16, ...).
state_dict load_safetensors(const std::string& path);

/// The "__metadata__" of a .safetensors file (empty when absent). Blocks. Errors: as load_safetensors.
safetensors_metadata load_safetensors_metadata(const std::string& path);

}  // namespace troupe
