#include "troupe/actors/rpc/codec.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

#include "intercept.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::rpc::detail {

// Note [tensor over shared memory] (rpc/bulk.cpp).
bool write_tensor_bulk(oarchive& ar, const tensor& h);
tensor read_tensor_bulk(iarchive& ar, const shape_t& sizes, troupe::dtype dt, std::uint64_t nbytes);

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> p(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && p ? std::string(p.get()) : std::string(mangled);
}

// Note [call interceptor]: only defined tensors are reported, on both sides, so the n-th tensor
// written is the n-th tensor read.
void write_tensor(oarchive& ar, const tensor& t) {
  if (t.defined())
    if (auto* s = active_scope()) guarded("on_tensor_written", [&] { s->on_tensor_written(t); });
  if (!t.defined()) {
    const std::uint8_t kind = 0, defined = 0;
    ar << kind << defined;
    return;
  }
  const tensor h = t.is_contiguous() && t.is_cpu() ? t : t.cpu().contiguous();
  if (write_tensor_bulk(ar, h)) return;  // kind 1: a shared-memory segment's name
  const std::uint8_t kind = 0, defined = 1;  // kind 0: inline bytes
  ar << kind << defined;
  const auto dt = static_cast<std::uint8_t>(h.dtype());
  const auto rank = static_cast<std::uint32_t>(h.dim());
  ar << dt << rank;
  for (std::int64_t s : h.sizes()) ar << s;
  const std::uint64_t nbytes = h.nbytes();
  ar << nbytes;
  if (nbytes > 0) ar.save_binary(h.data_ptr(), nbytes);
}

namespace {
tensor read_tensor_bytes(iarchive& ar) {
  std::uint8_t kind = 0, defined = 0, dt = 0;
  ar >> kind >> defined;
  if (kind > 1) throw error(errc::protocol_violation, "tensor payload kind " + std::to_string(kind) + " is unknown");
  if (!defined) return tensor();
  std::uint32_t rank = 0;
  ar >> dt >> rank;
  if (dt >= num_dtypes || rank > 64) throw error(errc::protocol_violation, "malformed tensor header in an rpc payload");
  shape_t sizes(rank);
  for (auto& s : sizes) ar >> s;
  std::uint64_t nbytes = 0;
  ar >> nbytes;
  for (auto s : sizes)
    if (s < 0) throw error(errc::protocol_violation, "negative size in an rpc tensor header");
  const auto type = static_cast<troupe::dtype>(dt);
  if (nbytes != static_cast<std::uint64_t>(numel_of(sizes)) * element_size(type))
    throw error(errc::protocol_violation, "tensor byte count does not match its shape");
  if (kind == 1) return read_tensor_bulk(ar, sizes, type, nbytes);  // a view of a pooled segment: no copy
  tensor t = empty(sizes, tensor_options{type});
  if (nbytes > 0) ar.load_binary(t.data_ptr(), nbytes);
  return t;
}

}  // namespace

tensor read_tensor(iarchive& ar) {
  tensor t = read_tensor_bytes(ar);
  if (t.defined())
    if (auto* s = active_scope()) return guarded("on_tensor_read", [&] { return s->on_tensor_read(std::move(t)); });
  return t;
}

}  // namespace troupe::rpc::detail
