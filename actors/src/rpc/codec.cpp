#include "troupe/actors/rpc/codec.hpp"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

#include "device_scope.hpp"
#include "rpc/cuda_ipc.hpp"
#include "rpc/bulk_segment.hpp"
#include "intercept.hpp"
#include "rpc/borrowed_parts.hpp"
#include "rpc/bulk.hpp"
#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::rpc::detail {

namespace {
// A tensor this large takes long enough to copy that the leader hands off first
// (codec_context::work, Note [predicted quick]).
constexpr std::size_t long_copy_bytes = std::size_t{256} << 10;
}  // namespace

// Note [tensor over shared memory] (rpc/bulk.hpp; rpc/bulk_codec.cpp).
bool write_tensor_bulk(writer& w, const tensor& h);
/// dtype, rank, sizes and byte count of a contiguous CPU tensor (shared by both tensor kinds).
void write_tensor_header(writer& w, const tensor& h);
tensor read_tensor_bulk(reader& r, const shape_t& sizes, troupe::dtype dt, std::uint64_t nbytes);
tensor read_tensor_shared(reader& r, const shape_t& sizes, troupe::dtype dt, std::uint64_t nbytes);
/// A contiguous tensor of `sizes` over `s`, starting `offset` elements in (received tensors that
/// view memory they did not allocate: segments, shared handles, adopted payloads).
tensor contiguous_view(std::shared_ptr<storage> s, const shape_t& sizes, troupe::dtype dt, std::int64_t offset = 0);

tensor contiguous_view(std::shared_ptr<storage> s, const shape_t& sizes, troupe::dtype dt, std::int64_t offset) {
  auto impl = std::make_shared<tensor_impl>();
  impl->storage = std::move(s);
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->offset = offset;
  impl->dtype = dt;
  return tensor(std::move(impl));
}

void reserve_from_pool(const codec_context& ctx, std::vector<char>& out, std::size_t need) {
  if (ctx.bulk) ctx.bulk->buffers().reserve(out, need);
}

std::string demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> p(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && p ? std::string(p.get()) : std::string(mangled);
}

void write_tensor_header(writer& w, const tensor& h) {
  w.pod(static_cast<std::uint8_t>(h.dtype()));
  w.pod(static_cast<std::uint32_t>(h.dim()));
  for (std::int64_t s : h.sizes()) w.pod(s);
  w.pod(static_cast<std::uint64_t>(h.nbytes()));
}

namespace {
// The gather list this encode may borrow into (Note [borrowed tensor bytes]), or null.
borrowed_parts* borrowing(const writer& w) {
  const codec_context& ctx = w.context();
  return ctx.borrow ? ctx.gather : nullptr;
}

/// Kind 0 (`device` < 0), 3 or 4 (with `device`). Writes the header, padding and the bytes of
/// contiguous CPU `h`. When large and the encode borrows, writes a borrowed part in their place.
void write_inline(writer& w, const tensor& h, std::uint8_t kind, std::int32_t device) {
  w.pod(kind);
  w.pod(std::uint8_t{1});  // defined
  if (kind != 0) w.pod(device);
  write_tensor_header(w, h);
  // Note [adopted payload]: the data at a 64-byte offset of the payload (a u8 count, then zeros).
  // Borrowed bytes before this point count: they are in the payload, not in the buffer.
  borrowed_parts* gather = borrowing(w);
  const std::size_t at = w.buffer().size() + (gather ? gather->bytes() : 0);
  const auto pad = static_cast<std::uint8_t>((64 - (at + 1) % 64) % 64);
  w.pod(pad);
  static constexpr char zeros[64] = {};
  w.raw(zeros, pad);
  if (gather && h.nbytes() >= borrow_min_bytes) return gather->add(w.buffer().size(), h);
  w.raw(h.data_ptr(), h.nbytes());
}

/// Note [rpc device map]: a CUDA tensor under a device scope.
void write_cuda_tensor(writer& w, const tensor& t, const device_scope& d) {
  if (d.answering()) {
    write_inline(w, t.cpu().contiguous(), 4, t.device().index);  // the caller maps it back
    return;
  }
  const std::int32_t to = d.target(t.device()).index;  // device_mismatch when unmapped
  if (d.ipc() && write_tensor_ipc(w, t, to, d.kept())) {
    d.count(true);
    return;
  }
  d.count(false);
  write_inline(w, t.cpu().contiguous(), 3, to);
}
}  // namespace

// Note [call interceptor]: only defined tensors are reported, on both sides, so the n-th tensor
// written is the n-th tensor read.
void write_tensor(writer& w, const tensor& t) {
  const codec_context& ctx = w.context();
  if (t.defined())
    if (auto* s = ctx.scope) guarded("on_tensor_written", [&] { s->on_tensor_written(t); });
  if (!t.defined()) {
    w.pod(std::uint8_t{0});  // kind
    w.pod(std::uint8_t{0});  // not defined
    return;
  }
  // A large copy ahead: a leading executor thread running quick jobs hands the lead off first.
  if (t.nbytes() >= long_copy_bytes && ctx.work) ctx.work->long_work_ahead();
  if (t.device().is_cuda())
    if (const auto* d = ctx.devices) return write_cuda_tensor(w, t, *d);
  const tensor h = t.is_contiguous() && t.is_cpu() ? t : t.cpu().contiguous();
  if (write_tensor_bulk(w, h)) return;  // kind 1 or 2: a shared-memory segment's handle
  write_inline(w, h, 0, -1);            // kind 0: inline bytes
}

namespace {
// A tensor viewing `n` bytes at `p` of a keeper's buffer; its storage holds the buffer's owner.
tensor adopt_bytes(const payload_keeper& k, const char* p, std::size_t n, const shape_t& sizes, troupe::dtype dt) {
  auto* keep = new std::shared_ptr<const void>(k.owner());
  data_ptr view(const_cast<char*>(p), cpu_device, [](void* c, void*) noexcept { delete static_cast<std::shared_ptr<const void>*>(c); }, keep);
  return contiguous_view(std::make_shared<storage>(std::move(view), n), sizes, dt);
}
}  // namespace

troupe::device result_devices::local_of(int remote) const { return result_device(peer_, reverse_, remote); }

void check_device_present(const shape_t& sizes, std::int32_t index) {
  const int visible = cuda::device_count();
  if (index < 0 || index >= visible)
    throw error(errc::device_mismatch, "an rpc tensor " + shape_to_string(sizes) + " was mapped to cuda:" + std::to_string(index) +
                                           " by a device map; this process sees " + std::to_string(visible) + " CUDA device(s)");
}

namespace {
/// A received kind-3 or kind-4 tensor on its CUDA device, ready on every stream.
tensor to_mapped_device(const tensor& host, std::int32_t index) {
  check_device_present(host.shape(), index);
  tensor t = host.to(cuda_device(index));
#if defined(TROUPE_WITH_CUDA)
  cuda::event ready(index);  // the stream rule: ready on every stream before the function runs
  ready.record();
  ready.synchronize();
#endif
  return t;
}

tensor read_tensor_body(reader& r, std::uint8_t kind, std::int32_t device = -1) {
  std::uint8_t dt = 0;
  std::uint32_t rank = 0;
  r.pod(dt);
  r.pod(rank);
  if (dt >= num_dtypes) throw error(errc::protocol_violation, "rpc tensor header: unknown dtype code " + std::to_string(dt));
  if (rank > 64) throw error(errc::protocol_violation, "rpc tensor header: rank " + std::to_string(rank) + " exceeds 64");
  shape_t sizes(rank);
  for (auto& s : sizes) r.pod(s);
  std::uint64_t nbytes = 0;
  r.pod(nbytes);
  const auto type = static_cast<troupe::dtype>(dt);
  std::int64_t expected = 0;
  try {
    expected = nbytes_of(sizes, type);  // overflow-checked: a wrapped count would pass a short buffer
  } catch (const troupe::error& e) {
    throw error(errc::protocol_violation, "rpc tensor header: " + e.message());
  }
  if (nbytes != static_cast<std::uint64_t>(expected))
    throw error(errc::protocol_violation, "rpc tensor header: byte count " + std::to_string(nbytes) + " does not match shape " +
                                              shape_to_string(sizes) + " of " + std::string(to_string(type)) + " (" +
                                              std::to_string(expected) + " bytes)");
  if (kind == 1) return read_tensor_bulk(r, sizes, type, nbytes);    // a view of a segment: no copy
  if (kind == 2) return read_tensor_shared(r, sizes, type, nbytes);  // a share_memory_() tensor, mapped
  if (kind == 5) {  // Note [rpc device map]: by IPC handle, opened in the node's cache of that peer
    const codec_context& ctx = r.context();
    auto* names = ctx.shm ? ctx.bulk : nullptr;
    return read_tensor_ipc(r, sizes, type, nbytes, device, names ? &names->ipc() : nullptr,
                           caf::to_string(ctx.peer ? *ctx.peer : caf::node_id{}));
  }
  std::uint8_t pad = 0;
  r.pod(pad);
  if (pad >= 64) throw error(errc::protocol_violation, "malformed tensor padding in an rpc payload");
  r.skip(pad);
  if (nbytes > r.left()) throw error(errc::protocol_violation, "an rpc tensor of " + std::to_string(nbytes) + " bytes is cut short");
  if (nbytes >= adopt_min_bytes && reinterpret_cast<std::uintptr_t>(r.pos()) % 16 == 0)  // Note [adopted payload]
    if (const auto* k = r.context().keeper; k && k->holds(r.pos(), nbytes) && nbytes * 2 >= k->capacity()) {
      tensor t = adopt_bytes(*k, r.pos(), nbytes, sizes, type);
      r.skip(nbytes);
      return t;
    }
  tensor t = empty(sizes, tensor_options{type});
  r.raw(t.data_ptr(), nbytes);
  return t;
}

tensor read_tensor_bytes(reader& r) {
  std::uint8_t kind = 0, defined = 0;
  r.pod(kind);
  r.pod(defined);
  if (kind > 5) throw error(errc::protocol_violation, "tensor payload kind " + std::to_string(kind) + " is unknown");
  if (!defined) return tensor();
  if (kind < 3) return read_tensor_body(r, kind);
  std::int32_t index = -1;
  r.pod(index);
  if (kind == 5) return read_tensor_body(r, kind, index);
  if (kind == 4) {  // a result: its device is the sender's; the reverse map says which is ours
    const result_devices* results = r.context().results;
    if (!results)
      throw error(errc::device_mismatch, "a CUDA tensor from cuda:" + std::to_string(index) +
                                             " of its sender arrived outside a call's result (no device map to place it by)");
    const std::int32_t local = results->local_of(index).index;
    return to_mapped_device(read_tensor_body(r, 0), local);
  }
  return to_mapped_device(read_tensor_body(r, 0), index);
}

}  // namespace

tensor read_tensor(reader& r) {
  tensor t = read_tensor_bytes(r);
  if (t.defined())
    if (auto* s = r.context().scope) return guarded("on_tensor_read", [&] { return s->on_tensor_read(std::move(t)); });
  return t;
}

}  // namespace troupe::rpc::detail
