// Tensor kinds 1 and 2 of the rpc codec: Note [tensor over shared memory] (rpc/bulk.hpp).
//   kind 1: a reference to a bulk segment (copied in, or a tensor that already is one);
//   kind 2: the handle of a share_memory_() tensor (file_descriptor or file_system strategy),
//           pinned by the sender until the receiver has mapped it.
#include <unistd.h>

#include <cstring>

#include "rpc/bulk_segment.hpp"
#include "troupe/actors/rpc/codec.hpp"
#include "troupe/actors/shared_memory.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::rpc::detail {

namespace d = troupe::detail;

void write_tensor_header(writer& w, const tensor& h);  // codec.cpp
tensor contiguous_view(std::shared_ptr<storage> s, const shape_t& sizes, troupe::dtype dt, std::int64_t offset = 0);  // codec.cpp

namespace {

/// What a segment-backed storage's data_ptr context is: the mapping it keeps alive.
struct seg_view {
  std::shared_ptr<d::seg_mapping> map;
};

const seg_view* view_of(const storage& s) {
  if (s.kind() != storage_kind::shared_memory || s.shared_handle().rfind(d::seg_handle_tag, 0) != 0) return nullptr;
  return static_cast<const seg_view*>(s.raw().context());
}

// Where a kind-1 tensor lives: the segment, the generation and the tensor's offset in it.
struct seg_ref {
  const d::seg_mapping* map = nullptr;
  std::uint64_t gen = 0;
  std::uint64_t offset = 0;
};

}  // namespace

namespace {

std::string peer_key(const codec_context& ctx) {
  return ctx.peer && *ctx.peer ? caf::to_string(*ctx.peer) : std::string();
}

// Whether `s` was shared by share_memory_() (shm_tensor.cpp tags such storages "fd:" / "fs:").
bool provider_shared(const storage& s) {
  const std::string& h = s.shared_handle();
  return s.kind() == storage_kind::shared_memory && (h.rfind("fd:", 0) == 0 || h.rfind("fs:", 0) == 0);
}

// A contiguous tensor of a share_memory_() storage: its handle, the storage pinned until the
// receiver mapped it. False (copy it instead) when it is no such tensor or no pin slot is free.
bool write_tensor_shared(writer& w, const tensor& h, d::bulk_names& names) {
  if (!provider_shared(*h.storage())) return false;
  const shm_handle sh = shared_handle_of(h);
  d::bulk_names::pin_ref pin;
  if (!names.pin(peer_key(w.context()), h.storage(), pin)) return false;
  d::table().add_own_shared(sh.name, h.storage());
  w.pod(std::uint8_t{2});  // kind 2: a shared tensor's handle
  w.pod(std::uint8_t{1});  // defined
  write_tensor_header(w, h);
  w.pod(static_cast<std::uint8_t>(sh.strategy));
  w.str(sh.name);
  w.pod(static_cast<std::uint64_t>(sh.nbytes));
  w.pod(static_cast<std::int32_t>(::getpid()));
  w.pod(static_cast<std::int32_t>(sh.fd));
  w.pod(static_cast<std::uint64_t>(h.storage_offset()) * element_size(h.dtype()));
  w.str(pin.segment->name);
  w.pod(static_cast<std::int32_t>(pin.segment->owner_fd));
  w.pod(pin.slot);
  w.pod(pin.ticket);
  return true;
}

}  // namespace

bool write_tensor_bulk(writer& w, const tensor& h) {
  const std::size_t nbytes = h.nbytes();
  const codec_context& ctx = w.context();
  d::bulk_names* names = ctx.shm ? ctx.bulk : nullptr;
  if (!names || nbytes < d::bulk_threshold || !names->reachable(peer_key(ctx))) return false;  // Note [shm reachability]
  if (write_tensor_shared(w, h, *names)) return true;  // kind 2: a share_memory_() tensor's handle
  seg_ref ref;
  if (const seg_view* v = view_of(*h.storage())) {  // already a segment: one more reference, no copy
    auto* hdr = d::header_of(v->map->base);
    hdr->refs.fetch_add(1, std::memory_order_acq_rel);  // our tensor holds one, so it is in use
    ref = {v->map.get(), hdr->gen.load(std::memory_order_acquire),
           static_cast<std::uint64_t>(static_cast<const char*>(h.data_ptr()) - static_cast<const char*>(v->map->base)) -
               d::header_bytes};
  } else {
    d::bulk_segment* seg = names->acquire(peer_key(ctx), nbytes);
    if (!seg) return false;  // pool closed or no segment: inline bytes
    std::memcpy(static_cast<char*>(seg->map->base) + d::header_bytes, h.data_ptr(), nbytes);
    ref = {seg->map.get(), seg->gen, 0};
  }
  w.pod(std::uint8_t{1});  // kind 1: a segment
  w.pod(std::uint8_t{1});  // defined
  write_tensor_header(w, h);
  w.str(ref.map->name);
  w.pod(ref.gen);
  w.pod(static_cast<std::int32_t>(ref.map->pid));
  w.pod(static_cast<std::int32_t>(ref.map->owner_fd));
  w.pod(ref.offset);
  w.pod(d::new_ticket());
  return true;
}

namespace {

// Takes this decode's reference and checks the generation. On the first decode of its ticket
// that is the message's reference; a duplicate takes a new one. Throws protocol_violation when
// the segment moved on.
void take_reference(d::segment_header* hdr, const std::string& name, std::uint64_t gen, std::uint64_t ticket) {
  const bool first = d::table().claim(ticket);
  const std::uint32_t refs = hdr->refs.load(std::memory_order_acquire);
  const bool live = first ? refs != d::refs_free && refs != d::refs_retired : d::try_ref(hdr);
  if (live && hdr->gen.load(std::memory_order_acquire) == gen) return;
  if (live && !first) d::release_ref(hdr);
  throw error(errc::protocol_violation, "shared-memory tensor " + name + " generation " + std::to_string(gen) + " is stale");
}

}  // namespace

// A tensor whose storage is the (cached) mapping of the segment; its deleter drops the
// reference. Only the mapping's own length bounds what is read.
tensor read_tensor_bulk(reader& r, const shape_t& sizes, troupe::dtype dt, std::uint64_t nbytes) {
  std::string name;
  std::uint64_t gen = 0, offset = 0, ticket = 0;
  std::int32_t pid = 0, fd = -1;
  r.str(name);
  r.pod(gen);
  r.pod(pid);
  r.pod(fd);
  r.pod(offset);
  r.pod(ticket);
  if (name.rfind(d::seg_prefix, 0) != 0 || name.find('/') != std::string::npos || pid <= 0 || fd < 0)
    throw error(errc::protocol_violation, "shared-memory tensor name '" + name + "' is not a troupe rpc segment");
  auto m = d::table().get(name, pid, fd);
  const std::size_t capacity = m->len - d::header_bytes;
  if (offset > capacity || nbytes > capacity - offset)
    throw error(errc::protocol_violation, "shared-memory tensor " + name + " is smaller than its " + std::to_string(nbytes) +
                                              " bytes at offset " + std::to_string(offset));
  take_reference(d::header_of(m->base), name, gen, ticket);
  auto* ctx = new seg_view{std::move(m)};
  data_ptr view(static_cast<char*>(ctx->map->base) + d::header_bytes + offset, cpu_device,
                [](void* c, void*) noexcept {
                  auto* v = static_cast<seg_view*>(c);
                  d::release_ref(d::header_of(v->map->base));
                  delete v;
                },
                ctx);
  auto st = std::make_shared<storage>(std::move(view), nbytes, storage_kind::shared_memory);
  st->set_shared_handle(d::seg_handle_tag + name);
  return contiguous_view(std::move(st), sizes, dt);
}

namespace {

// Clears the sender's pin slot once the tensor is mapped (the sender may then let go of it).
void unpin(const std::string& name, std::int32_t pid, std::int32_t fd, std::uint32_t slot, std::uint64_t ticket) {
  auto pins = d::table().pins(name, pid, fd);
  if (slot >= (pins->len - d::header_bytes) / sizeof(std::uint64_t))
    throw error(errc::protocol_violation, "pin slot " + std::to_string(slot) + " is outside pin segment " + name);
  auto* slots = static_cast<std::atomic<std::uint64_t>*>(static_cast<void*>(static_cast<char*>(pins->base) + d::header_bytes));
  slots[slot].compare_exchange_strong(ticket, 0, std::memory_order_acq_rel);  // a duplicate finds it cleared
}

bool plain_name(const std::string& n, const std::string& prefix) {
  return n.rfind(prefix, 0) == 0 && n.find('/', 1) == std::string::npos && n.size() < 200;
}

}  // namespace

// A share_memory_() tensor of the sender, mapped here (writes are seen both ways).
tensor read_tensor_shared(reader& r, const shape_t& sizes, troupe::dtype dt, std::uint64_t nbytes) {
  std::uint8_t strategy = 0;
  std::string name, pin_name;
  std::uint64_t seg_bytes = 0, offset = 0, ticket = 0;
  std::int32_t pid = 0, fd = -1, pin_fd = -1;
  std::uint32_t slot = 0;
  r.pod(strategy);
  r.str(name);
  r.pod(seg_bytes);
  r.pod(pid);
  r.pod(fd);
  r.pod(offset);
  r.str(pin_name);
  r.pod(pin_fd);
  r.pod(slot);
  r.pod(ticket);
  const bool fs = strategy == static_cast<std::uint8_t>(sharing_strategy::file_system);
  const std::size_t es = element_size(dt);
  if (strategy > 1 || pid <= 0 || pin_fd < 0 || (!fs && fd < 0) || !plain_name(pin_name, d::seg_prefix) ||
      !plain_name(name, fs ? "/troupe_" : "troupe_") || offset % es != 0 || offset > seg_bytes || nbytes > seg_bytes - offset)
    throw error(errc::protocol_violation, "malformed shared tensor handle '" + name + "' in an rpc payload");
  shm_handle h{fs ? sharing_strategy::file_system : sharing_strategy::file_descriptor, name, seg_bytes, -1};
  tensor t;
  // One we sent (names are unique per process), back from any peer: the very same storage.
  if (auto own = d::table().own_shared(name)) {
    if (own->nbytes() < seg_bytes) throw error(errc::protocol_violation, "shared tensor " + name + " is smaller than its handle says");
    t = contiguous_view(std::move(own), sizes, dt, static_cast<std::int64_t>(offset / es));
  } else if (fs) {
    t = tensor_from_shared_handle(h, dt, sizes, contiguous_strides(sizes), static_cast<std::int64_t>(offset / es));
  } else {
    unique_fd ours(d::open_peer_memfd(name, pid, fd));
    h.fd = ours.get();
    t = tensor_from_shared_handle(h, dt, sizes, contiguous_strides(sizes), static_cast<std::int64_t>(offset / es));
  }
  unpin(pin_name, pid, pin_fd, slot, ticket);
  return t;
}

}  // namespace troupe::rpc::detail
