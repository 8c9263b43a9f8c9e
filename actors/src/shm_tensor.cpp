// The shared_memory_provider of the runtime, share_memory_(), and rebuilding tensors from handles.
//
// A shared storage's data_ptr owns its shm_segment. The data_ptr context is the segment, held in
// a unique_ptr that the deleter reclaims. storage::shared_handle() is "fd:<name>" or
// "fs:<name>", which is how shared_handle_of() knows the context is one of ours.

#include <unistd.h>

#include <cstring>
#include <random>

#include "troupe/actors/shared_memory.hpp"

namespace troupe {

namespace {

constexpr const char* fd_tag = "fd:";
constexpr const char* fs_tag = "fs:";

void delete_segment(void* ctx, void* /*ptr*/) noexcept { std::unique_ptr<shm_segment> owned(static_cast<shm_segment*>(ctx)); }

std::string tag_of(const shm_segment& seg) {
  return (seg.strategy() == sharing_strategy::file_system ? fs_tag : fd_tag) + seg.name();
}

// A data_ptr that owns `seg` (its deleter destroys the segment: unmap, close, unlink).
data_ptr own_segment(shm_segment seg) {
  auto owned = std::make_unique<shm_segment>(std::move(seg));
  data_ptr p(owned->data(), cpu_device, &delete_segment, owned.get());
  owned.release();  // the data_ptr's deleter owns it now
  return p;
}

// Wraps a segment into a storage that owns it.
std::shared_ptr<storage> storage_over(shm_segment seg) {
  const std::size_t n = seg.size();
  std::string tag = tag_of(seg);
  auto s = std::make_shared<storage>(own_segment(std::move(seg)), n, storage_kind::shared_memory);
  s->set_shared_handle(std::move(tag));
  return s;
}

// The segment behind a storage shared by this module, or null.
const shm_segment* segment_of(const storage& s) {
  if (s.kind() != storage_kind::shared_memory) return nullptr;
  const std::string& h = s.shared_handle();
  if (h.rfind(fd_tag, 0) != 0 && h.rfind(fs_tag, 0) != 0) return nullptr;
  return static_cast<const shm_segment*>(s.raw().context());
}

std::string random_hex() {
  std::random_device rd;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
  return buf;
}

}  // namespace

shm_provider::shm_provider(std::string job) : shm_provider(sharing_strategy::file_descriptor, std::move(job)) {}

shm_provider::shm_provider(sharing_strategy strategy, std::string job, std::shared_ptr<shm_manager_client> client)
    : strategy_(strategy), job_(std::move(job)), client_(std::move(client)) {
  prefix_ = shm_name_prefix(job_) + std::to_string(::getpid()) + "_" + random_hex() + "_";
  if (client_ && client_->job() != job_)
    throw error(errc::bad_argument, "shm_provider: job '" + job_ + "' but the manager client serves job '" +
                                        client_->job() + "'");
}

shm_segment shm_provider::make_segment(std::size_t nbytes) {
  const std::string name = prefix_ + std::to_string(counter_.fetch_add(1));
  if (strategy_ == sharing_strategy::file_descriptor) return shm_segment::create_memfd(nbytes, name.substr(1));
  if (!client_) return shm_segment::create_named(nbytes, name);
  client_->register_segment(name);  // before it exists: see Note [shm manager]
  shm_segment seg;
  try {
    seg = shm_segment::create_named(nbytes, name);
  } catch (...) {
    try { client_->unregister_segment(name); } catch (const error&) {}  // best effort; the error below matters
    throw;
  }
  std::weak_ptr<shm_manager_client> weak = client_;
  seg.set_unlink_hook([weak](const std::string& n) noexcept {
    if (auto c = weak.lock()) {
      try { c->unregister_segment(n); } catch (const error&) {}  // manager gone or forked copy: nothing to undo
    }
  });
  return seg;
}

std::shared_ptr<storage> shm_provider::allocate(std::size_t nbytes) { return storage_over(make_segment(nbytes)); }

void shm_provider::share(storage& s) {
  if (s.kind() == storage_kind::shared_memory) return;
  if (!s.dev().is_cpu())
    throw error(errc::device_mismatch, "share_memory_: storage on " + to_string(s.dev()) + "; only CPU tensors can be shared");
  shm_segment seg = make_segment(s.nbytes());
  if (s.nbytes() > 0) std::memcpy(seg.data(), s.data(), s.nbytes());
  std::string tag = tag_of(seg);
  s.swap_data(own_segment(std::move(seg)), storage_kind::shared_memory);
  s.set_shared_handle(std::move(tag));
}

tensor& share_memory_(tensor& t, shared_memory_provider& provider) {
  if (!t.defined()) throw error(errc::invalid_state, "share_memory_ on an undefined tensor");
  if (!t.is_cpu())
    throw error(errc::device_mismatch, "share_memory_: tensor " + shape_to_string(t.shape()) + " on " +
                                           to_string(t.device()) + "; only CPU tensors can be shared");
  provider.share(*t.storage());
  return t;
}

bool is_shared(const tensor& t) { return t.defined() && t.storage()->kind() == storage_kind::shared_memory; }

shm_handle shared_handle_of(const tensor& t) {
  const shm_segment* seg = t.defined() ? segment_of(*t.storage()) : nullptr;
  if (seg == nullptr)
    throw error(errc::invalid_state, "shared_handle_of: tensor " + (t.defined() ? shape_to_string(t.shape()) : "undefined") +
                                         " is not in shared memory (call share_memory_ first)");
  return seg->handle();
}

shared_tensor_meta describe_shared(const tensor& t) {
  shared_tensor_meta m;
  m.storage = shared_handle_of(t);
  m.dtype = t.dtype();
  m.sizes = t.sizes();
  m.strides = t.strides();
  m.offset = t.storage_offset();
  return m;
}

tensor tensor_from_shared_handle(const shm_handle& h, troupe::dtype dtype, const shape_t& shape, const shape_t& strides,
                                 std::int64_t offset) {
  const std::string what = "tensor_from_shared_handle(" + std::string(to_string(h.strategy)) + " '" + h.name + "', " +
                           shape_to_string(shape) + ")";
  if (shape.size() != strides.size() || offset < 0)
    throw error(errc::bad_argument, what + ": strides " + shape_to_string(strides) + " / offset " + std::to_string(offset) +
                                        " do not fit the shape");
  std::int64_t last = offset;  // index of the furthest element
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || strides[i] < 0) throw error(errc::bad_argument, what + ": negative size or stride");
    if (shape[i] == 0) last = -1;
    if (last >= 0) last += (shape[i] - 1) * strides[i];
  }
  const auto need = static_cast<std::uint64_t>(last + 1) * element_size(dtype);
  if (last >= 0 && need > h.nbytes)
    throw error(errc::bad_argument, what + ": needs " + std::to_string(need) + " bytes, the segment has " + std::to_string(h.nbytes));
  shm_segment seg = h.strategy == sharing_strategy::file_descriptor ? shm_segment::map_fd(h.fd, h.nbytes, h.name)
                                                                    : shm_segment::open_named(h.name, h.nbytes);
  auto impl = std::make_shared<tensor_impl>();
  impl->storage = storage_over(std::move(seg));
  impl->sizes = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = dtype;
  return tensor(std::move(impl));
}

tensor tensor_from_shared_meta(const shared_tensor_meta& m) {
  return tensor_from_shared_handle(m.storage, m.dtype, m.sizes, m.strides, m.offset);
}

}  // namespace troupe
