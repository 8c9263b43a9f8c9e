#pragma once
/// \file error.hpp
/// The one error type of Troupe. Every layer throws or returns `troupe::error`; the actors layer
/// converts it to and from `caf::error` so the same code and message cross processes.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace troupe {

/// Documented error codes. The numeric values are part of the wire format: append, never reorder.
enum class errc : std::uint8_t {
  ok = 0,
  /// A bounded wait ran out (a future, a barrier, a store wait, a collective).
  timeout = 1,
  /// A peer process died or stopped answering; the message names the worker.
  peer_lost = 2,
  /// The owner of an RRef died; the message names the owner.
  owner_lost = 3,
  /// A user function threw on a remote worker; the message carries its text, worker and function.
  remote_exception = 4,
  /// An RPC named a function that is not registered on the callee.
  unknown_function = 5,
  /// An argument does not match the registered signature, or a value is out of its domain.
  bad_argument = 6,
  /// Tensor shapes are incompatible for an op.
  shape_mismatch = 7,
  /// Tensor dtypes are incompatible for an op.
  dtype_mismatch = 8,
  /// Tensors live on different devices, or an op is not available on a device.
  device_mismatch = 9,
  /// A connection did not present the job token.
  unauthorized = 10,
  /// A peer sent a message that breaks the protocol.
  protocol_violation = 11,
  /// A CUDA or cuBLAS call failed; the message holds the call, file and line.
  cuda_failure = 12,
  /// An NCCL call failed.
  nccl_failure = 13,
  /// A checkpoint or tensor file is truncated, corrupted, or of an unknown version.
  checkpoint_corrupt = 14,
  /// A dimension or index is out of range.
  index_out_of_range = 15,
  /// A tensor layout cannot be viewed as requested (view of non-contiguous data).
  invalid_view = 16,
  /// An autograd invariant was violated by the caller (second backward without retain_graph,
  /// saved tensor modified in place, grad of a tensor that does not require grad).
  autograd_error = 17,
  /// An I/O operation (file, socket, shared memory) failed; the message names the resource.
  io_error = 18,
  /// The object is not in a state that allows the call (shut down, already joined, moved-from).
  invalid_state = 19,
  /// A collective's arguments differ across ranks (op, dtype, shape or sequence number).
  collective_mismatch = 20,
  /// Something the library does not support (yet); the message says what.
  not_supported = 21,
};

/// The stable snake_case name of an error code ("peer_lost").
std::string_view to_string(errc code) noexcept;

/// The Troupe error: a code plus a message that names what was wrong (op, shapes, worker, ...).
class error : public std::runtime_error {
 public:
  error(errc code, std::string message);

  /// The error code.
  errc code() const noexcept { return code_; }
  /// The message without the code prefix.
  const std::string& message() const noexcept { return message_; }

 private:
  errc code_;
  std::string message_;
};

}  // namespace troupe

/// Internal invariant check; never for user input (user input gets a troupe::error).
#define TROUPE_ASSERT(cond)                                                                   \
  do {                                                                                        \
    if (!(cond)) ::troupe::detail::assert_fail(#cond, __FILE__, __LINE__);                    \
  } while (false)

namespace troupe::detail {
[[noreturn]] void assert_fail(const char* cond, const char* file, int line);
}
