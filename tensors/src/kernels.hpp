#pragma once
// Private: the kernel contract between the op layer (tensors/src/ops/*.cpp, which validates,
// promotes dtypes, broadcasts, allocates outputs and records autograd) and the two backends
// (tensors/src/cpu/*.cpp and tensors/src/cuda/*.cu). Kernels never validate user input: the op
// layer guarantees the preconditions stated here. Every kernel handles arbitrary strides
// (including 0-strides from expand) and is fast on contiguous data.

#include <cstdint>

#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe::kernels {

enum class binary_op : std::uint8_t { add, sub, mul, div, pow, maximum, minimum };
enum class unary_op : std::uint8_t { neg, abs, exp, log, sqrt, rsqrt, relu, sigmoid, tanh, gelu, sign };
enum class compare_op : std::uint8_t { eq, ne, lt, le, gt, ge };
enum class reduce_op : std::uint8_t { sum, mean, max, min };

// Preconditions (binary/compare/where): out, a, b have the same shape (a and b expanded by the
// caller), a and b have the same dtype; out has that dtype (compare: bool). out may alias a
// (in-place forms) but is otherwise freshly allocated.
// `alpha` scales b for add/sub (a + alpha*b).
namespace cpu {
void binary(binary_op op, const tensor& out, const tensor& a, const tensor& b, double alpha);
void binary_scalar(binary_op op, const tensor& out, const tensor& a, double b);
void unary(unary_op op, const tensor& out, const tensor& a);
void compare(compare_op op, const tensor& out, const tensor& a, const tensor& b);
void where(const tensor& out, const tensor& cond, const tensor& a, const tensor& b);
/// dst and src same shape, any dtypes (converted), any strides. dst may not overlap src.
void copy(const tensor& dst, const tensor& src);
void fill(const tensor& out, double value);
/// out has a's shape with reduced dims set to 1 (keepdim form), same dtype as a.
/// `dims` sorted, unique, non-empty.
void reduce(reduce_op op, const tensor& out, const tensor& a, const shape_t& dims);
/// out (int64) has a's shape with `dim` set to 1; first index of max (is_max) or min.
void arg_reduce(bool is_max, const tensor& out, const tensor& a, std::int64_t dim);
/// out (same dtype) has a's shape with dims set to 1; variance with `correction`.
void var(const tensor& out, const tensor& a, const shape_t& dims, std::int64_t correction);
/// out[b] = a[b] @ b[b] for 3-d operands [B,n,k] x [B,k,m] -> [B,n,m] (batch strides may be 0);
/// out contiguous, same float dtype for all. out = beta*out + alpha*(a@b) (beta 0 ignores out).
void gemm(const tensor& out, const tensor& a, const tensor& b, double alpha, double beta);
/// softmax / log_softmax along dim; out contiguous, same shape and dtype as a.
void softmax(const tensor& out, const tensor& a, std::int64_t dim, bool log);
/// out = a.index_select(dim, index) with index int64 1-d, already range-checked.
void index_select(const tensor& out, const tensor& a, std::int64_t dim, const tensor& index);
/// out[.. i ..] = a[.. index[.. i ..] ..] along dim (torch.gather); index int64, range-checked.
void gather(const tensor& out, const tensor& a, std::int64_t dim, const tensor& index);
/// out (already a copy of the base) += src scattered by index along dim (torch.scatter_add_).
void scatter_add(const tensor& out, std::int64_t dim, const tensor& index, const tensor& src);
/// out (already a copy of the base) slices at index[i] along dim += src slice i.
void index_add(const tensor& out, std::int64_t dim, const tensor& index, const tensor& src);
/// Element i (in contiguous order of out) from Philox(gen seed, offset block i/4 word i%4).
void uniform(const tensor& out, std::uint64_t seed, std::uint64_t offset, double low, double high);
void normal(const tensor& out, std::uint64_t seed, std::uint64_t offset, double mean, double std);
void randint(const tensor& out, std::uint64_t seed, std::uint64_t offset, std::int64_t low, std::int64_t high);
}  // namespace cpu

// The CUDA backend implements the same contract for tensors on cuda devices (all operands on
// one device; kernels enqueue on the device's current stream). Compiled when TROUPE_WITH_CUDA.
namespace cuda {
void binary(binary_op op, const tensor& out, const tensor& a, const tensor& b, double alpha);
void binary_scalar(binary_op op, const tensor& out, const tensor& a, double b);
void unary(unary_op op, const tensor& out, const tensor& a);
void compare(compare_op op, const tensor& out, const tensor& a, const tensor& b);
void where(const tensor& out, const tensor& cond, const tensor& a, const tensor& b);
/// Same device on both sides (cross-device copies go through copy_between_devices).
void copy(const tensor& dst, const tensor& src);
void fill(const tensor& out, double value);
void reduce(reduce_op op, const tensor& out, const tensor& a, const shape_t& dims);
void arg_reduce(bool is_max, const tensor& out, const tensor& a, std::int64_t dim);
void var(const tensor& out, const tensor& a, const shape_t& dims, std::int64_t correction);
void gemm(const tensor& out, const tensor& a, const tensor& b, double alpha, double beta);
void softmax(const tensor& out, const tensor& a, std::int64_t dim, bool log);
void index_select(const tensor& out, const tensor& a, std::int64_t dim, const tensor& index);
void gather(const tensor& out, const tensor& a, std::int64_t dim, const tensor& index);
void scatter_add(const tensor& out, std::int64_t dim, const tensor& index, const tensor& src);
void index_add(const tensor& out, std::int64_t dim, const tensor& index, const tensor& src);
void uniform(const tensor& out, std::uint64_t seed, std::uint64_t offset, double low, double high);
void normal(const tensor& out, std::uint64_t seed, std::uint64_t offset, double mean, double std);
void randint(const tensor& out, std::uint64_t seed, std::uint64_t offset, std::int64_t low, std::int64_t high);
/// Copies between host and device or between devices: same shape and dtype, both contiguous.
/// Host->device and device->host copies are asynchronous on the current stream of the CUDA side.
/// A pageable host side is staged through pinned memory. The call returns once the host buffer
/// may be reused; for device->host that is after the copy completed.
void copy_between_devices(const tensor& dst, const tensor& src);
}  // namespace cuda

}  // namespace troupe::kernels

namespace troupe::detail {
/// Throws device_mismatch: a CUDA tensor reached a build without the CUDA backend.
[[noreturn]] void no_cuda(const char* what);
}  // namespace troupe::detail

/// Calls kernels::cpu::fn or kernels::cuda::fn by the device `dev`.
#if defined(TROUPE_WITH_CUDA)
#define TROUPE_DISPATCH(dev, fn, ...)                                     \
  do {                                                                    \
    if ((dev).is_cuda()) ::troupe::kernels::cuda::fn(__VA_ARGS__);        \
    else ::troupe::kernels::cpu::fn(__VA_ARGS__);                         \
  } while (false)
#else
#define TROUPE_DISPATCH(dev, fn, ...)                                     \
  do {                                                                    \
    if ((dev).is_cuda()) ::troupe::detail::no_cuda(#fn);                  \
    ::troupe::kernels::cpu::fn(__VA_ARGS__);                              \
  } while (false)
#endif
