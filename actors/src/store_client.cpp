// The blocking store client (troupe/actors/store.hpp).
#include <caf/all.hpp>

#include "store_actor.hpp"
#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/messages.hpp"
#include "troupe/actors/store.hpp"

namespace troupe {

namespace {

// Requests that do not wait on the store's side still need a bound in case its host is gone.
constexpr auto quick_timeout = std::chrono::milliseconds(10000);
constexpr auto grace = std::chrono::milliseconds(2000);

template <class R, class Msg>
R ask(detail::store_client_impl& impl, Msg msg, std::chrono::milliseconds timeout, const std::string& what) {
  if (!impl.sys || !impl.store) throw error(errc::invalid_state, what + ": the node has no store connection");
  caf::scoped_actor self{*impl.sys};
  std::conditional_t<std::is_void_v<R>, caf::unit_t, R> out{};
  caf::error err;
  if constexpr (std::is_void_v<R>) {
    self->request(impl.store, timeout + grace, std::move(msg)).receive([&]() {}, [&](caf::error& e) { err = std::move(e); });
  } else {
    self->request(impl.store, timeout + grace, std::move(msg)).receive([&](R& v) { out = std::move(v); },
                                                                          [&](caf::error& e) { err = std::move(e); });
  }
  if (err) throw from_caf_error(err, what);
  if constexpr (!std::is_void_v<R>) return out;
}

}  // namespace

store_client::store_client(std::unique_ptr<detail::store_client_impl> impl) : impl_(std::move(impl)) {}
store_client::~store_client() = default;

void store_client::set(const std::string& key, const std::string& value) {
  ask<void>(*impl_, store_set{key, value}, quick_timeout, "store set '" + key + "'");
}

std::string store_client::get(const std::string& key, std::chrono::milliseconds timeout) {
  return ask<std::string>(*impl_, store_get{key, timeout.count()}, timeout, "store get '" + key + "'");
}

std::int64_t store_client::add(const std::string& key, std::int64_t delta) {
  return ask<std::int64_t>(*impl_, store_add{key, delta}, quick_timeout, "store add '" + key + "'");
}

void store_client::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  ask<std::string>(*impl_, store_wait{keys, timeout.count()}, timeout, "store wait");
}

std::string store_client::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  return ask<std::string>(*impl_, store_cas{key, expected, desired}, quick_timeout, "store compare_set '" + key + "'");
}

bool store_client::erase(const std::string& key) {
  return ask<bool>(*impl_, store_erase{key}, quick_timeout, "store erase '" + key + "'");
}

std::int64_t store_client::num_keys() { return ask<std::int64_t>(*impl_, store_num_keys{}, quick_timeout, "store num_keys"); }

void store_client::barrier(const std::string& name, std::int32_t rank, std::int32_t world_size, std::chrono::milliseconds timeout) {
  ask<void>(*impl_, store_barrier{name, rank, world_size, timeout.count()}, timeout, "store barrier '" + name + "'");
}

}  // namespace troupe
