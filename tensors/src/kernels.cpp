// The kernel dispatch's one out-of-line helper (kernels.hpp).
#include "kernels.hpp"

#include <string>

namespace troupe::detail {

void no_cuda(const char* what) {
  throw error(errc::device_mismatch, std::string(what) + ": CUDA tensor, but Troupe was built without CUDA");
}

}  // namespace troupe::detail
