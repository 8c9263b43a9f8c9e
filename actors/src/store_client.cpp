// The blocking store client (troupe/actors/store.hpp).
//
// Note [store client]
//
// A user thread never talks to the store directly. It hands a job to the node's store proxy (an
// event-based actor, one per client) and blocks on a promise. The proxy sends the typed request
// with a deadline: the operation's timeout plus a grace period. It monitors the store when it is
// remote, so each call ends exactly once:
//
//   user --job--> proxy --request(deadline)--> store
//   user <--promise-- proxy <--reply | error | deadline (timeout) | store down (peer_lost)
//
// A store host that dies fails every pending call with peer_lost naming the host within the
// runtime's peer-loss bound (the down_msg), not after the timeout. A later call finds the proxy
// lost. The client then reconnects once, bounded (Note [lost peer re-admission]). It rebinds the
// proxy to the fresh store handle and sends the call again; it was never sent, so this is no
// retry. When the host does not answer, the call fails with peer_lost naming it. The user
// thread also bounds its own wait (deadline + 1 s) in case the proxy itself is gone. Stopping
// the client (destructor) exits the proxy, which fails what is still pending with invalid_state.
//
// Note [store faults]
//
// A node's transport hook sees its store traffic on the proxy, which every store call of the
// node passes. It sees each request before it is sent, as on_send of a store_request from this
// worker to the store host's. There `function` is the reserved name of the operation
// ("troupe.store.get" and so on), and `payload` its first key's bytes. It sees each answer when
// it arrives, as on_send of a store_response from the host to this worker that names the same
// function. The store host's node sees nothing of it. The hook's decision drops, delays or
// duplicates it. A fault plan matches these by the operation, by "troupe.store:KEY", by
// "troupe.store" (all of them) or by "*", and its partitions cut them.
// With a hook, every call has an expiry at its deadline on the proxy. A lost request or answer
// ends the call there with a timeout naming the operation, the key and the store host, never a
// hang. A duplicated request runs twice on the store (an add adds twice); the first answer ends
// the call. Without a hook nothing of this runs.
#include <future>
#include <map>

#include <caf/all.hpp>

#include "store_actor.hpp"
#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/messages.hpp"
#include "troupe/actors/store.hpp"

namespace troupe {

namespace detail {

/// One call's outcome, delivered once by the proxy.
struct store_outcome {
  caf::error err;
  caf::message value;
  bool refused = false;  ///< never sent: the store was lost before
};

/// Points the proxy at a fresh store handle after a reconnect (local only).
struct store_rebind {
  caf::actor store;
};

/// A job run on the proxy; the proxy may end it early (store lost, proxy stopped, expiry).
struct store_job {
  std::function<void(caf::event_based_actor*, const std::function<void(store_outcome)>&)> run;
  std::shared_ptr<std::promise<store_outcome>> done;
  std::string op;   ///< "troupe.store.get", ... (Note [store faults])
  std::string key;  ///< its first key
  std::chrono::milliseconds deadline{0};
};

/// A job whose sending a fault delays, or an answer a fault delays (Note [store faults]).
struct store_later {
  std::uint64_t id = 0;
  std::shared_ptr<store_job> job;  ///< set: send it now
  store_outcome out;               ///< otherwise: deliver this answer now
  int copies = 1;                  ///< of the job
};

}  // namespace detail
}  // namespace troupe

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::store_job)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::store_rebind)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::store_later)

namespace troupe {

namespace {

// Requests that do not wait on the store's side still need a bound in case its host is gone.
constexpr auto quick_timeout = std::chrono::milliseconds(10000);
constexpr auto grace = std::chrono::milliseconds(2000);

using expire_atom = caf::atom_constant<caf::atom("stexpire")>;

struct proxy_state {
  std::map<std::uint64_t, std::shared_ptr<std::promise<detail::store_outcome>>> pending;
  caf::error lost;  // set while the store is gone
  caf::actor_addr store;  // the store watched now
  std::uint64_t next_id = 1;

  ~proxy_state() {
    for (auto& [id, p] : pending)
      p->set_value({to_caf_error(errc::invalid_state, "store client stopped while a call was pending"), {}});
  }
};

using proxy_actor = caf::stateful_actor<proxy_state>;

// Ends pending call `id` with `out` (nothing when it already ended).
void finish_call(proxy_actor* self, std::uint64_t id, detail::store_outcome out) {
  auto it = self->state.pending.find(id);
  if (it == self->state.pending.end()) return;  // already ended: down handler, expiry, first answer
  auto p = std::move(it->second);
  self->state.pending.erase(it);
  p->set_value(std::move(out));
}

// Note [store faults]: the hook and the two ends of this client's store traffic. It is a copy
// the proxy owns, since the proxy may outlive the client by a message or two.
struct store_route {
  std::shared_ptr<transport_hook> hook;
  std::string me, host_worker;
};
using route_ptr = std::shared_ptr<const store_route>;

// What the hook does to a store message of `job`.
transport_decision store_fault(const store_route& r, message_kind kind, const detail::store_job& job) {
  const bool request = kind == message_kind::store_request;
  envelope env{kind, request ? r.me : r.host_worker, request ? r.host_worker : r.me, 0, job.op, std::vector<char>(job.key.begin(), job.key.end()), {}};
  return r.hook->on_send(env);
}

// The answer handler of call `id`: each answer passes the hook before it ends the call.
std::function<void(detail::store_outcome)> faulted_answer(proxy_actor* self, const route_ptr& route, std::uint64_t id,
                                                          const std::shared_ptr<detail::store_job>& job) {
  return [self, route, id, job](detail::store_outcome out) {
    const auto d = store_fault(*route, message_kind::store_response, *job);
    if (d.copies <= 0) return;  // lost: the expiry ends the call
    if (d.delay.count() > 0) self->delayed_send(self, d.delay, detail::store_later{id, nullptr, std::move(out)});
    else finish_call(self, id, std::move(out));
  };
}

// Sends `job` (call `id`) through the hook's faults.
void send_faulted(proxy_actor* self, const route_ptr& route, std::uint64_t id, const std::shared_ptr<detail::store_job>& job) {
  auto answer = faulted_answer(self, route, id, job);
  const auto d = store_fault(*route, message_kind::store_request, *job);
  if (d.delay.count() > 0 && d.copies > 0) {
    self->delayed_send(self, d.delay, detail::store_later{id, job, {}, d.copies});
    return;
  }
  for (int i = 0; i < d.copies; ++i) job->run(self, answer);
}

caf::behavior store_proxy(proxy_actor* self, caf::actor store, std::string host, route_ptr route) {
  if (store && store.node() != self->node()) self->monitor(store);
  self->state.store = store.address();
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source != self->state.store) return;  // a store handle replaced since
    self->state.lost = to_caf_error(errc::peer_lost, "the store host (" + host + ") is gone: " + caf::to_string(dm.reason));
    auto pending = std::move(self->state.pending);
    self->state.pending.clear();
    for (auto& [id, p] : pending) p->set_value({self->state.lost, {}});
  });
  return {
      [=](detail::store_job& job) {
        if (self->state.lost) {
          job.done->set_value({self->state.lost, {}, true});
          return;
        }
        const auto id = self->state.next_id++;
        self->state.pending.emplace(id, job.done);
        if (route) {  // Note [store faults]
          self->delayed_send(self, job.deadline, expire_atom::value, id, job.deadline.count());
          send_faulted(self, route, id, std::make_shared<detail::store_job>(std::move(job)));
          return;
        }
        job.run(self, [self, id](detail::store_outcome out) { finish_call(self, id, std::move(out)); });
      },
      [=](detail::store_later& later) {
        if (!later.job) {
          finish_call(self, later.id, std::move(later.out));
          return;
        }
        if (self->state.pending.count(later.id) == 0) return;  // expired meanwhile
        auto answer = faulted_answer(self, route, later.id, later.job);
        for (int i = 0; i < later.copies; ++i) later.job->run(self, answer);
      },
      [=](expire_atom, std::uint64_t id, std::int64_t ms) {
        finish_call(self, id, {to_caf_error(errc::timeout, "no answer from the store host (" + host + ") within " + std::to_string(ms) + " ms"), {}});
      },
      [=](detail::store_rebind& r) {
        self->state.lost = caf::error{};
        self->state.store = r.store.address();
        if (r.store.node() != self->node()) self->monitor(r.store);
      },
  };
}

// Note [lost peer re-admission]: one bounded reconnect to the store host, unless another thread
// already made one since `seen`. Throws peer_lost naming the host when it does not answer.
void readmit(detail::store_client_impl& impl, const caf::actor& seen, const std::string& what) {
  std::lock_guard<std::mutex> lock(*impl.mu);
  if (impl.store != seen) return;
  caf::actor fresh;
  try {
    fresh = impl.reconnect();
  } catch (const error& e) {
    throw error(errc::peer_lost, what + ": the store host (" + impl.host + ") was lost and does not answer: " + e.message());
  }
  impl.store = fresh;
  caf::anon_send(impl.proxy, detail::store_rebind{fresh});
}

template <class R, class Msg>
detail::store_outcome submit(detail::store_client_impl& impl, const caf::actor& untyped, const Msg& msg,
                             std::chrono::milliseconds timeout, const std::string& what, const std::string& op, const std::string& key) {
  auto store = caf::actor_cast<detail::store_handle>(untyped);
  const auto deadline = timeout + grace;
  detail::store_job job;
  job.done = std::make_shared<std::promise<detail::store_outcome>>();
  job.op = op;
  job.key = key;
  job.deadline = deadline;
  auto result = job.done->get_future();
  job.run = [store, deadline, msg](caf::event_based_actor* self, const std::function<void(detail::store_outcome)>& finish) {
    auto on_error = [finish](caf::error& e) { finish({std::move(e), {}}); };
    if constexpr (std::is_void_v<R>) {
      self->request(store, deadline, msg).then([finish]() { finish({{}, caf::make_message()}); }, on_error);
    } else {
      self->request(store, deadline, msg).then([finish](R& v) { finish({{}, caf::make_message(std::move(v))}); }, on_error);
    }
  };
  caf::anon_send(impl.proxy, std::move(job));
  if (impl.work) impl.work->long_work_ahead();  // Note [predicted quick]: a leader about to block hands the lead off
  if (result.wait_for(deadline + std::chrono::seconds(1)) != std::future_status::ready)
    throw error(errc::timeout, what + ": no answer from the store host (" + impl.host + ")");
  return result.get();
}

template <class R, class Msg>
R ask(detail::store_client_impl& impl, Msg msg, std::chrono::milliseconds timeout, const std::string& what, const std::string& op,
      const std::string& key) {
  if (!impl.sys || !impl.proxy) throw error(errc::invalid_state, what + ": the node has no store connection");
  caf::actor seen;
  {
    std::lock_guard<std::mutex> lock(*impl.mu);
    seen = impl.store;
  }
  detail::store_outcome out = submit<R>(impl, seen, msg, timeout, what, op, key);
  if (out.refused && impl.reconnect) {
    readmit(impl, seen, what);
    {
      std::lock_guard<std::mutex> lock(*impl.mu);
      seen = impl.store;
    }
    out = submit<R>(impl, seen, msg, timeout, what, op, key);
  }
  if (out.err) {
    auto e = from_caf_error(out.err, what);
    if (e.message().find(what) == std::string::npos) throw error(e.code(), what + ": " + e.message());
    throw e;
  }
  if constexpr (!std::is_void_v<R>) return out.value.get_as<R>(0);
}

}  // namespace

store_client::store_client(std::unique_ptr<detail::store_client_impl> impl) : impl_(std::move(impl)) {
  if (impl_->sys && impl_->store) impl_->proxy = impl_->sys->spawn(store_proxy, impl_->store, impl_->host,
                                   impl_->hook ? std::make_shared<const store_route>(store_route{impl_->hook, impl_->me, impl_->host_worker}) : nullptr);
}

std::shared_ptr<peer_events> store_client::peer_losses() const { return impl_->events; }

store_client::~store_client() {
  if (impl_->proxy) caf::anon_send_exit(impl_->proxy, caf::exit_reason::user_shutdown);
}

void store_client::set(const std::string& key, const std::string& value) {
  ask<void>(*impl_, store_set{key, value}, quick_timeout, "store set '" + key + "'", "troupe.store.set", key);
}

std::string store_client::get(const std::string& key, std::chrono::milliseconds timeout) {
  return ask<std::string>(*impl_, store_get{key, timeout.count()}, timeout, "store get '" + key + "'", "troupe.store.get", key);
}

std::int64_t store_client::add(const std::string& key, std::int64_t delta) {
  return ask<std::int64_t>(*impl_, store_add{key, delta}, quick_timeout, "store add '" + key + "'", "troupe.store.add", key);
}

void store_client::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  ask<std::string>(*impl_, store_wait{keys, timeout.count()}, timeout, "store wait", "troupe.store.wait", keys.empty() ? std::string() : keys.front());
}

std::string store_client::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  return ask<std::string>(*impl_, store_cas{key, expected, desired}, quick_timeout, "store compare_set '" + key + "'", "troupe.store.compare_set", key);
}

bool store_client::erase(const std::string& key) {
  return ask<bool>(*impl_, store_erase{key}, quick_timeout, "store erase '" + key + "'", "troupe.store.erase", key);
}

std::int64_t store_client::num_keys() {
  return ask<std::int64_t>(*impl_, store_num_keys{}, quick_timeout, "store num_keys", "troupe.store.num_keys", "");
}

void store_client::barrier(const std::string& name, std::int32_t rank, std::int32_t world_size, std::chrono::milliseconds timeout) {
  ask<void>(*impl_, store_barrier{name, rank, world_size, timeout.count()}, timeout, "store barrier '" + name + "'", "troupe.store.barrier", name);
}

}  // namespace troupe
