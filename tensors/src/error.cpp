#include "troupe/tensors/error.hpp"

#include <cstdio>
#include <cstdlib>

namespace troupe {

std::string_view to_string(errc code) noexcept {
  switch (code) {
    case errc::ok: return "ok";
    case errc::timeout: return "timeout";
    case errc::peer_lost: return "peer_lost";
    case errc::owner_lost: return "owner_lost";
    case errc::remote_exception: return "remote_exception";
    case errc::unknown_function: return "unknown_function";
    case errc::bad_argument: return "bad_argument";
    case errc::shape_mismatch: return "shape_mismatch";
    case errc::dtype_mismatch: return "dtype_mismatch";
    case errc::device_mismatch: return "device_mismatch";
    case errc::unauthorized: return "unauthorized";
    case errc::protocol_violation: return "protocol_violation";
    case errc::cuda_failure: return "cuda_failure";
    case errc::nccl_failure: return "nccl_failure";
    case errc::checkpoint_corrupt: return "checkpoint_corrupt";
    case errc::index_out_of_range: return "index_out_of_range";
    case errc::invalid_view: return "invalid_view";
    case errc::autograd_error: return "autograd_error";
    case errc::io_error: return "io_error";
    case errc::invalid_state: return "invalid_state";
    case errc::collective_mismatch: return "collective_mismatch";
    case errc::not_supported: return "not_supported";
  }
  return "unknown_error";
}

error::error(errc code, std::string message)
    : std::runtime_error(std::string(to_string(code)) + ": " + message),
      code_(code),
      message_(std::move(message)) {}

namespace detail {
void assert_fail(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "troupe: internal invariant failed: %s at %s:%d\n", cond, file, line);
  std::abort();
}
}  // namespace detail

}  // namespace troupe
