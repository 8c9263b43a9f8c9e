// The non-template half of the Boost tensor record (troupe/tensors/boost_tensor.hpp): validation,
// allocation, checksums and the host-side contiguous gather used for saving.
#include "troupe/tensors/boost_tensor.hpp"

#include <string>

#include "checksum.hpp"
#include "troupe/tensors/allocator.hpp"

namespace troupe::detail {

namespace {

[[noreturn]] void corrupt(const std::string& what) {
  throw error(errc::checkpoint_corrupt, "tensor record: " + what);
}

// Copies the elements of a strided CPU tensor into `dst` in row-major order; `Word` has the
// element size, so each element moves as one load and one store.
template <class Word>
void gather(char* dst, const tensor& src) {
  const auto& sizes = src.sizes();
  const auto& strides = src.strides();
  const auto* base = static_cast<const Word*>(src.data_ptr());
  auto* out = reinterpret_cast<Word*>(dst);
  const std::size_t rank = sizes.size();
  if (rank == 0) {
    *out = *base;
    return;
  }
  const std::int64_t inner = sizes[rank - 1], inner_stride = strides[rank - 1];
  const std::int64_t rows = inner == 0 ? 0 : src.numel() / inner;
  shape_t idx(rank, 0);
  for (std::int64_t row = 0; row < rows; ++row) {
    std::int64_t off = 0;
    for (std::size_t d = 0; d + 1 < rank; ++d) off += idx[d] * strides[d];
    const Word* p = base + off;
    for (std::int64_t i = 0; i < inner; ++i) *out++ = p[i * inner_stride];
    for (std::size_t d = rank - 1; d-- > 0;) {  // odometer over the outer dims
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
  }
}

struct word2 { std::uint16_t v; };
struct word1 { std::uint8_t v; };

tensor new_host_tensor(troupe::dtype dt, const shape_t& sizes, std::size_t nbytes) {
  auto impl = std::make_shared<tensor_impl>();
  impl->storage = storage::make(nbytes, cpu_allocator());
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->dtype = dt;
  return tensor(std::move(impl));
}

}  // namespace

void archive_input_bound::set(std::streambuf& sb) {
  const auto cur = sb.pubseekoff(0, std::ios::cur, std::ios::in);
  const auto end = sb.pubseekoff(0, std::ios::end, std::ios::in);
  if (cur < 0 || end < 0 || sb.pubseekpos(cur, std::ios::in) != cur) return;  // not seekable
  sb_ = &sb;
  end_ = static_cast<std::uint64_t>(static_cast<std::streamoff>(end));
}

std::optional<std::uint64_t> archive_input_bound::remaining() const {
  if (!sb_) return std::nullopt;
  const auto cur = sb_->pubseekoff(0, std::ios::cur, std::ios::in);
  if (cur < 0) return std::nullopt;
  const auto pos = static_cast<std::uint64_t>(static_cast<std::streamoff>(cur));
  return pos > end_ ? 0 : end_ - pos;
}

tensor host_contiguous(const tensor& t) {
  tensor h = t.is_cuda() ? t.to(cpu_device) : t;
  if (h.is_contiguous()) return h;
  tensor out = new_host_tensor(h.dtype(), h.sizes(), h.nbytes());
  if (h.numel() == 0) return out;
  auto* dst = static_cast<char*>(out.data_ptr());
  switch (h.element_size()) {
    case 8: gather<std::uint64_t>(dst, h); break;
    case 4: gather<std::uint32_t>(dst, h); break;
    case 2: gather<word2>(dst, h); break;
    default: gather<word1>(dst, h); break;
  }
  return out;
}

std::uint64_t tensor_checksum(const tensor& t) { return checksum64(t.data_ptr(), t.nbytes()); }

void check_record_prefix(const tensor_record& r) {
  if (r.version != tensor_record_version)
    corrupt("unsupported record version " + std::to_string(r.version) + " (this build reads " +
            std::to_string(tensor_record_version) + ")");
  if (r.defined > 1) corrupt("invalid defined flag " + std::to_string(r.defined));
  if (r.dtype >= num_dtypes) corrupt("invalid dtype code " + std::to_string(r.dtype));
  if (r.rank > max_tensor_rank)
    corrupt("rank " + std::to_string(r.rank) + " exceeds the maximum of " + std::to_string(max_tensor_rank));
}

void check_record_sizes(const tensor_record& r, std::optional<std::uint64_t> remaining) {
  std::uint64_t numel = 1;
  for (std::int64_t s : r.sizes) {
    if (s < 0) corrupt("negative size in " + shape_to_string(r.sizes));
    if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(s), &numel) || numel > (std::uint64_t{1} << 60))
      corrupt("element count of shape " + shape_to_string(r.sizes) + " overflows");
  }
  const auto dt = static_cast<troupe::dtype>(r.dtype);
  const std::uint64_t expected = numel * element_size(dt);
  if (r.nbytes != expected)
    corrupt("byte count " + std::to_string(r.nbytes) + " does not match shape " + shape_to_string(r.sizes) + " of " +
            std::string(to_string(dt)) + " (" + std::to_string(expected) + " bytes)");
  if (remaining && r.nbytes > *remaining)
    corrupt("tensor of " + std::to_string(r.nbytes) + " bytes but only " + std::to_string(*remaining) +
            " bytes left in the input");
}

tensor allocate_for_record(const tensor_record& r) {
  return new_host_tensor(static_cast<troupe::dtype>(r.dtype), r.sizes, static_cast<std::size_t>(r.nbytes));
}

void check_record_checksum(const tensor& t, const tensor_record& r) {
  const std::uint64_t got = tensor_checksum(t);
  if (got != r.checksum)
    corrupt("checksum mismatch for a " + std::string(to_string(t.dtype())) + " tensor of shape " +
            shape_to_string(t.sizes()) + " (data corrupted)");
}

}  // namespace troupe::detail
