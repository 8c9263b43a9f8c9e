// Opens cuBLAS on first use (Note [cuBLAS on demand] in cublas_api.hpp).
#include "cublas_api.hpp"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "troupe/tensors/error.hpp"

#ifndef TROUPE_CUBLAS_LIBRARY
#error "TROUPE_CUBLAS_LIBRARY names the cuBLAS shared library (set by tensors/CMakeLists.txt)"
#endif

namespace troupe::cuda_detail {

namespace {

std::string loader_error() {
  const char* why = ::dlerror();
  return why ? why : "unknown reason";
}

// The library by its soname, searched as for a linked library (LD_LIBRARY_PATH, this program's
// run path, the system's), else at the path found when the project was configured.
void* open_library() {
  static constexpr const char* path = TROUPE_CUBLAS_LIBRARY;
  const std::string file = std::string(path).substr(std::string(path).rfind('/') + 1);
  if (void* h = ::dlopen(file.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  const std::string by_name = loader_error();
  if (void* h = ::dlopen(path, RTLD_NOW | RTLD_LOCAL)) return h;
  throw error(errc::cuda_failure, "cannot open cuBLAS: " + file + ": " + by_name + "; " + path + ": " + loader_error());
}

template <class Fn>
void resolve(void* lib, Fn& fn, const char* symbol) {
  fn = reinterpret_cast<Fn>(::dlsym(lib, symbol));
  if (fn == nullptr) throw error(errc::cuda_failure, std::string("cuBLAS has no ") + symbol + ": " + loader_error());
}

cublas_api load() {
  void* lib = open_library();  // stays open for the process (Note [cuBLAS on demand])
  cublas_api api;
  resolve(lib, api.create, "cublasCreate_v2");
  resolve(lib, api.destroy, "cublasDestroy_v2");
  resolve(lib, api.set_stream, "cublasSetStream_v2");
  resolve(lib, api.sgemm_strided_batched, "cublasSgemmStridedBatched");
  resolve(lib, api.dgemm_strided_batched, "cublasDgemmStridedBatched");
  resolve(lib, api.gemm_strided_batched_ex, "cublasGemmStridedBatchedEx");
  resolve(lib, api.status_name, "cublasGetStatusName");
  resolve(lib, api.status_string, "cublasGetStatusString");
  return api;
}

}  // namespace

const cublas_api& cublas() {
  // The process's one copy of the entry points, like the dynamic linker's table they replace.
  // A load that throws leaves the flag unset, so the next call tries again.
  static std::once_flag once;
  static cublas_api api;
  std::call_once(once, [] { api = load(); });
  return api;
}

}  // namespace troupe::cuda_detail
