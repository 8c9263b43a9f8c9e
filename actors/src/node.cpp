// The node (Note [job token] in troupe/actors/node.hpp).
#include "troupe/actors/node.hpp"

#include "troupe/actors/fault_plan.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/io/basp_broker.hpp>

#include "caf_gate.hpp"
#include "executor.hpp"
#include "peer_dialer.hpp"
#include "peer_links.hpp"
#include "remote/remote_actors.hpp"
#include "rpc/agent.hpp"
#include "rpc/bulk.hpp"
#include "rpc/device_scope.hpp"
#include "rpc/direct_channel.hpp"
#include "rpc/blame_board.hpp"
#include "rpc_watch.hpp"
#include "shutdown_hooks.hpp"
#include "silence_watch.hpp"
#include "store_actor.hpp"
#include "tls_relay.hpp"
#include "troupe/actors/host_address.hpp"
#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/messages.hpp"
#include "troupe/actors/remote_actor.hpp"
#include "troupe/actors/workers.hpp"

namespace troupe {

struct node::impl {
  rpc::device_maps device_maps;  // Note [rpc device map]
  node_options opts;
  worker_info me;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::shared_ptr<detail::auth_set> auth = std::make_shared<detail::auth_set>();
  std::shared_ptr<rpc::registry> functions;
  std::shared_ptr<detail::executor> exec;
  std::shared_ptr<const rpc::detail::call_state::poster> poster;  // every call's continuations go to exec
  std::shared_ptr<detail::bulk_names> bulk = std::make_shared<detail::bulk_names>();
  std::shared_ptr<rpc::detail::interceptor_slot> interceptor = std::make_shared<rpc::detail::interceptor_slot>();
  std::shared_ptr<detail::direct_channel> channel;  // Note [direct channel]: carries every call and actor frame
  std::shared_ptr<transport_hook> hook;     // the fault plan and other interception; may be null
  std::shared_ptr<detail::remote_actors> remote;  // Note [remote actors]; null without channel
  caf::actor agent;
  caf::actor basp;  // the middleman's BASP broker: admitted sockets go to it (Note [CAF port gate])
  std::unique_ptr<detail::caf_gate> gate;
  std::shared_ptr<detail::tls_relays> tls;  // Note [tls relay]; null when TLS is off
  caf::actor store_actor;  // the store handle (local on rank 0, remote elsewhere)
  std::uint16_t port = 0;
  std::unique_ptr<store_client> store;
  std::shared_ptr<peer_events> events;  // Note [peer loss events]
  std::unique_ptr<detail::peer_dialer> dialer;  // Note [hello retry]; made before the gate opens
  std::unique_ptr<detail::peer_links> links;    // Note [one connect per peer]; made before the gate opens
  std::atomic<bool> down{false};
  std::shared_ptr<flight_recorder> recorder;  // Note [flight recorder]; lives as long as the node
  std::atomic<std::uint64_t> calls_made{0};   // numbers the recorded calls
  std::unique_ptr<detail::silence_watch> silence;  // Note [silent peers]; null unless the hook may silence
  std::shared_ptr<rpc::detail::blame_board> blames;  // Note [rpc blame]; null when blame_after is 0
  std::unique_ptr<detail::rpc_watch> rpc_blame;

  void start_blame(node& self);

  void watch_silence();

  void configure();
  void start(std::shared_ptr<transport_hook> hook);
  void start_peers();
  void open_gate();
  caf::actor reconnect_store(std::chrono::milliseconds timeout);
  detail::peer_link resolve(const std::string& name, std::chrono::milliseconds timeout);
  void start_direct_channel(detail::agent_config& ac);
  void await_actors_gone(std::chrono::milliseconds bound);
  void teardown();
  std::shared_ptr<detail::shutdown_hooks> stop_hooks = std::make_shared<detail::shutdown_hooks>();  // Note [shutdown hooks]
};

void node::impl::configure() {
  register_messages(cfg);
  cfg.load<caf::io::middleman>();
  cfg.set("scheduler.policy", caf::atom_from_string(opts.scheduler_policy));
  cfg.set("scheduler.max-threads", opts.scheduler_threads);
  cfg.set("middleman.workers", opts.middleman_workers);
  cfg.set("middleman.heartbeat-interval", caf::timespan(opts.heartbeat_interval));
  cfg.set("middleman.connection-timeout", caf::timespan(opts.connection_timeout));
  cfg.set("logger.console", caf::atom("none"));
  for (const auto& [k, v] : opts.caf_overrides) cfg.set(k, v);
  cfg.add_message_type<tensor>("troupe.tensor");  // Note [remote actors]
  for (const auto& setup : opts.actor_setup) setup(cfg);
}

namespace {
bool loopback(const std::string& addr) { return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0; }

// Note [job token]: an empty token admits any process that can reach the port.
void check_token(const node_options& o, const std::string& me) {
  if (!o.job_token.empty()) return;
  if (!loopback(o.listen_addr))
    throw error(errc::unauthorized, me + ": an empty job token is refused when listening on " + o.listen_addr + " (not loopback)");
  if (!o.allow_empty_token)
    throw error(errc::unauthorized, me + ": an empty job token needs node_options::allow_empty_token (it admits any local process)");
}
}  // namespace

// Note [lost peer re-admission]: the store client's way back to a store host it lost.
caf::actor node::impl::reconnect_store(std::chrono::milliseconds timeout) {
  return dialer->greet({}, opts.master_addr, opts.master_port, timeout, true).store;
}

detail::peer_link node::impl::resolve(const std::string& name, std::chrono::milliseconds timeout) {
  if (!links) throw error(errc::invalid_state, "node " + me.name + " has not started");
  return links->resolve(name, timeout);
}

void node::impl::start(std::shared_ptr<transport_hook> given) {
  me = worker_info{opts.worker_name(), opts.rank, opts.world_size};
  // Note [fault events]: a program run with TROUPE_FAULTS=FILE runs under that plan.
  if (const char* plan = std::getenv("TROUPE_FAULTS"); !given && plan && *plan)
    given = std::make_shared<fault_injector>(fault_plan::load(plan), fault_injector::stderr_log());
  hook = given;
  check_token(opts, me.name);
  if (auto ctx = make_tls_context(opts.tls)) tls = std::make_shared<detail::tls_relays>(me.name, std::move(ctx));  // io_error naming a file
  events = std::make_shared<peer_events>(me.name, [this](const std::string& name, std::chrono::milliseconds timeout) { resolve(name, timeout); });
  if (opts.rank == 0) events->set_store_host(me.name);
  configure();
  sys = std::make_unique<caf::actor_system>(cfg);
  auth->add(sys->node());
  if (!opts.shared_memory_rpc) bulk->disable_shared_memory();
  bulk->set_reachable(caf::to_string(sys->node()), true);  // calls to itself (off: ignored)
  exec = std::make_shared<detail::executor>(opts.executor_threads);
  poster = std::make_shared<const rpc::detail::call_state::poster>([exec = exec](std::function<void()> f) { return exec->post(std::move(f)); });
  if (opts.rank == 0) store_actor = detail::spawn_store(*sys, auth);
  detail::agent_config ac{me, opts.job_token, auth, bulk, store_actor, nullptr, nullptr, nullptr};
  start_direct_channel(ac);
  {
    remote = std::make_shared<detail::remote_actors>(*sys, me, channel, bulk, device_maps, [this](const std::string& w, std::chrono::milliseconds t) {
      auto l = resolve(w, t);
      return detail::actor_peer{l.agent.node(), l.conn};
    });
    channel->set_actor_sink(remote);
  }
  ac.on_peer_down = [this, weak = std::weak_ptr<detail::direct_channel>(channel), ev = events](const std::string& name, const std::string& reason) {
    links->lose(name, reason);
    dialer->forget(name);
    if (auto f = weak.lock()) f->peer_down(name, reason);
    ev->notify(peer_loss{name, reason, false});  // Note [peer loss events]
  };
  ac.on_greeted = [this](const std::string& name, const caf::actor& peer_agent) { dialer->greeted(name, peer_agent); };  // Note [greeted peers]
  agent = detail::spawn_agent(*sys, std::move(ac));
  start_peers();
  watch_silence();
  open_gate();
  std::string store_worker = me.name;
  if (opts.rank != 0) {
    auto ack = dialer->greet({}, opts.master_addr, opts.master_port, opts.join_timeout, false);
    store_actor = ack.store;
    store_worker = ack.info.name;
    events->set_store_host(ack.info.name);
    links->add(ack, opts.master_addr, opts.join_timeout);
  }
  const std::string store_host = opts.rank == 0 ? "rank 0, this node" : "rank 0 at " + opts.master_addr + ":" + std::to_string(opts.master_port);
  detail::store_client_impl sc;
  sc.sys = sys.get();
  sc.store = store_actor;
  sc.host = store_host;
  sc.events = events;
  sc.hook = hook;  // Note [store faults]
  sc.me = me.name;
  sc.host_worker = store_worker;
  sc.work = exec;  // Note [predicted quick]
  const auto bound = std::max(opts.connection_timeout, std::chrono::milliseconds(1000));
  if (opts.rank != 0) sc.reconnect = [this, bound] { return reconnect_store(bound); };
  store = std::make_unique<store_client>(std::make_unique<detail::store_client_impl>(std::move(sc)));
  // Note [listen and advertise]: peers get a reachable address, never the wildcard.
  store->set("troupe/addr/" + me.name, advertised_address(opts.listen_addr, opts.master_addr) + ":" + std::to_string(port));
  store->set("troupe/worker/" + std::to_string(me.rank), me.name);  // the worker list (workers.hpp)
}

// Note [silent peers]
void node::impl::watch_silence() {
  if (!hook || !hook->may_silence()) return;
  auto linked = [this] { return links->names(); };
  auto declare = [this](const std::string& peer, const std::string& reason) { caf::anon_send(agent, detail::peer_silent_msg{peer, reason}); };
  silence = std::make_unique<detail::silence_watch>(me.name, hook, opts.connection_timeout, linked, declare);
}

// The dialer and the links exist before the gate opens: a peer's hello may come right after.
void node::impl::start_peers() {
  basp = sys->middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  dialer = std::make_unique<detail::peer_dialer>(detail::peer_dialer_config{sys.get(), me, opts.job_token, agent, basp, bulk, tls.get()});
  detail::peer_links_config lc;
  lc.sys = sys.get();
  lc.me = me;
  lc.listen_addr = opts.listen_addr;
  lc.readmit_window = std::max(opts.connection_timeout, std::chrono::milliseconds(1000));
  lc.agent = agent;
  lc.bulk = bulk;
  lc.channel = channel;
  lc.dialer = dialer.get();
  lc.address_of = [this](const std::string& worker, std::chrono::milliseconds timeout) { return store->get("troupe/addr/" + worker, timeout); };
  lc.store_host = [this] { return events->store_host(); };
  links = std::make_unique<detail::peer_links>(std::move(lc));
}

// Note [CAF port gate]: the agent is published behind the gate, on each admitted socket.
void node::impl::open_gate() {
  const std::uint16_t want = opts.rank == 0 ? opts.master_port : 0;
  gate = std::make_unique<detail::caf_gate>(
      detail::caf_gate_config{me.name, opts.listen_addr, want, opts.job_token, opts.auth_deadline, opts.max_unauthenticated, tls},
      [this](int fd) {
        caf::anon_send(basp, caf::publish_atom::value, sys->middleman().backend().new_scribe(fd), port,
                       caf::actor_cast<caf::strong_actor_ptr>(agent), std::set<std::string>{});
      });
  port = gate->port();
  gate->start();
}

// The direct channel carries every call; a node that cannot open it does not start.
void node::impl::start_direct_channel(detail::agent_config& ac) {
  channel = std::make_shared<detail::direct_channel>(detail::direct_channel_config{me, sys->node(), opts.listen_addr, functions, exec, bulk, hook, interceptor,
                                                                  opts.auth_deadline, opts.max_unauthenticated, recorder.get(), opts.max_message_bytes, tls});
  channel->start();
  ac.issue_ticket = [weak = std::weak_ptr<detail::direct_channel>(channel)](const std::string& peer, const caf::node_id& node) {
    auto f = weak.lock();
    return f ? std::make_pair(f->port(), f->issue_ticket(peer, node)) : std::make_pair(std::uint16_t{0}, std::string());
  };
}

// Note [teardown order]: remote nodes hold proxies to our agent, store and to CAF's internal
// SpawnServ and ConfigServ, so the BASP broker monitors those actors. Left to ~actor_system,
// SpawnServ and ConfigServ get their exit message only just before middleman::stop()
// finalizes the broker. Their down messages then race the broker's end. Under that race the
// broker, the down message and ConfigServ survive the system in a reference cycle
// (LeakSanitizer, about 1 run in 10 under load). So all four exit here, while the multiplexer
// still runs and the broker can process their down messages, and we wait (bounded) for each.
void node::impl::await_actors_gone(std::chrono::milliseconds bound) {
  const auto end = std::chrono::steady_clock::now() + bound;
  caf::scoped_actor self{*sys};
  auto stop = [&](const caf::actor& who) {
    if (!who) return;
    self->monitor(who);
    self->send_exit(who, caf::exit_reason::user_shutdown);
    for (bool gone = false; !gone && std::chrono::steady_clock::now() < end;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      self->receive([&](const caf::down_msg& dm) { gone = dm.source == who.address(); }, caf::after(left) >> [] {});
    }
  };
  stop(agent);
  if (opts.rank == 0) stop(store_actor);
  stop(caf::actor_cast<caf::actor>(sys->spawn_serv()));
  stop(caf::actor_cast<caf::actor>(sys->config_serv()));
}

void node::impl::teardown() {
  if (down.exchange(true)) return;
  stop_hooks->run_all();  // Note [shutdown hooks]: the layers stop their actors on the running system
  rpc_blame.reset();  // Note [rpc blame]: asks nothing from now on
  silence.reset();  // Note [silent peers]: declares nothing from now on
  if (gate) gate->stop();  // admits nobody from now on
  if (events) events->detach();
  if (agent) caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
  if (store_actor && opts.rank == 0) caf::anon_send_exit(store_actor, caf::exit_reason::user_shutdown);
  if (remote) remote->shutdown();  // kills every proxy of a remote actor
  if (channel) channel->stop();  // fails its pending calls; served calls finishing below write to closed sockets
  exec->stop();
  bulk->unlink_all();  // Note [tensor over shared memory]: segments nobody decoded
  if (links) links->clear();
  if (dialer) dialer->forget_all();
  store.reset();
  await_actors_gone(std::chrono::seconds(5));  // Note [teardown order]
  agent = nullptr;
  store_actor = nullptr;
  remote.reset();  // its proxy registry refers to the system
  basp = nullptr;
  sys.reset();  // joins every CAF thread once all actors are gone
  if (tls) tls->stop();  // after CAF: its last bytes go out through the relays
  recorder->write_trace();
}

// Note [rpc blame]: the callee's answer, and the watch of this node's own calls.
void node::impl::start_blame(node& self) {
  functions->add(
      detail::blame_function,
      [rec = recorder, me = me.name](const std::string& caller, const std::string& function) { return detail::where_is(*rec, me, caller, function); },
      rpc::function_options{.quick = true});
  if (opts.blame_after.count() <= 0) return;
  blames = std::make_shared<rpc::detail::blame_board>();
  auto ask = [&self, me = me.name](const std::string& callee, const std::string& function, std::chrono::milliseconds timeout) {
    return self.call(callee, detail::blame_function, [&](const rpc::codec_context& ctx) { return rpc::encode_args<std::string, std::string>(ctx, me, function); }, timeout);
  };
  rpc_blame = std::make_unique<detail::rpc_watch>(me.name, recorder, blames, opts.blame_after, ask, opts.on_blame);
}

node::node(node_options opts, const rpc::registry& functions, std::shared_ptr<transport_hook> hook) : impl_(std::make_unique<impl>()) {
  impl_->opts = std::move(opts);
  impl_->recorder = std::make_shared<flight_recorder>(
      impl_->opts.recorder_capacity, trace_target{impl_->opts.trace_dir, impl_->opts.rank, impl_->opts.worker_name()});
  impl_->functions = std::make_shared<rpc::registry>(functions);
  for (const auto& [peer, map] : impl_->opts.device_maps) rpc::validate_device_map(peer, map);
  try {
    impl_->start(std::move(hook));
    impl_->start_blame(*this);
    // Peer names are checked against the worker list, which needs every rank to have started.
    for (const auto& [peer, map] : impl_->opts.device_maps) set_device_map(peer, map, impl_->opts.join_timeout);
  } catch (...) {
    if (impl_->sys) impl_->teardown();
    throw;
  }
}

void node::set_device_map(const std::string& worker, const rpc::device_map& map, std::chrono::milliseconds timeout) {
  rpc::validate_device_map(worker, map);
  static_cast<void>(get_worker_info(*this, worker, timeout));  // bad_argument naming the workers
  impl_->device_maps.set(worker, map);
}

node::~node() {
  try {
    impl_->teardown();
  } catch (...) {
    // Destructors never throw; teardown only throws on internal failures.
  }
}

const worker_info& node::info() const { return impl_->me; }
rpc::device_transfers node::device_transfers() const { return impl_->device_maps.transfers(); }
std::uint16_t node::port() const { return impl_->port; }
caf::actor_system& node::system() {
  if (!impl_->sys) throw error(errc::invalid_state, "node " + impl_->me.name + " is shut down");
  return *impl_->sys;
}
std::uint16_t node::rpc_port() const { return impl_->channel ? impl_->channel->port() : 0; }
rpc::registry& node::functions() { return *impl_->functions; }
detail::remote_actors& node::remote_actors() {
  if (!impl_->remote || impl_->down)
    throw error(errc::invalid_state, "node " + impl_->me.name + (impl_->down ? " is shut down" : " has no direct channel for remote actors"));
  return *impl_->remote;
}
store_client& node::store() {
  if (!impl_->store) throw error(errc::invalid_state, "node " + impl_->me.name + " is shut down");
  return *impl_->store;
}
std::chrono::milliseconds node::default_timeout() const { return impl_->opts.default_timeout; }
flight_recorder& node::recorder() { return *impl_->recorder; }
std::shared_ptr<flight_recorder> node::shared_recorder() { return impl_->recorder; }
void node::fault_point(const std::string& point, std::int64_t step) {
  if (impl_->hook) impl_->hook->on_point(impl_->me.name, point, step);
}
transport_decision node::payload_fault(envelope& msg) { return impl_->hook ? impl_->hook->on_send(msg) : transport_decision{}; }
bool node::has_transport_hook() const noexcept { return impl_->hook != nullptr; }
const std::shared_ptr<peer_events>& node::peer_losses() const { return impl_->events; }
shutdown_hook node::at_shutdown(std::function<void()> stop) {
  const std::uint64_t id = impl_->down ? 0 : impl_->stop_hooks->add(std::move(stop));
  if (id == 0) throw error(errc::invalid_state, "node " + impl_->me.name + " is shut down");
  return shutdown_hook(impl_->stop_hooks, id);
}

namespace {
std::shared_ptr<rpc::call_scope> begin_call_scope(const std::shared_ptr<rpc::call_interceptor>& ic, const std::string& to,
                                                  const std::string& function) {
  if (!ic) return nullptr;
  return rpc::detail::guarded("begin_call", [&] { return ic->begin_call(to, function); });
}
}  // namespace

std::shared_ptr<rpc::detail::call_state> node::call(const std::string& to, const std::string& function,
                                                    const std::function<std::vector<char>(const rpc::codec_context&)>& encode,
                                                    std::chrono::milliseconds timeout, bool blocking) {
  auto& im = *impl_;
  auto st = std::make_shared<rpc::detail::call_state>(function, to, im.me.name, std::chrono::steady_clock::now() + timeout, im.poster, im.exec);
  const auto seq = ++im.calls_made;
  st->set_trace(im.recorder, im.recorder->begin(trace_kind::rpc_call, function, seq, to));
  if (im.blames) st->set_blame(im.blames, seq);
  if (im.down) {
    st->complete(errc::invalid_state, st->what() + ": the node is shut down", {});
    return st;
  }
  detail::peer_link peer;
  try {
    peer = im.resolve(to, timeout);
  } catch (const error& e) {
    const errc code = e.code() == errc::timeout ? errc::peer_lost : e.code();
    st->complete(code, st->what() + ": cannot reach worker " + to + ": " + e.message(), {});
    return st;
  }
  std::vector<char> payload, meta;
  rpc::detail::borrowed_parts borrowed;  // only a blocking call's arguments borrow (Note [borrowed tensor bytes])
  try {
    const caf::node_id& node = peer.agent.node();
    // Note [rpc device map]: IPC handles only to another process of this host.
    const rpc::detail::device_scope devices(im.device_maps, to, detail::same_host_other_process(node, im.sys->node()));
    st->set_result_map(rpc::invert_device_map(to, im.device_maps.of(to)));
    auto intercepted = begin_call_scope(im.interceptor->get(), to, function);
    rpc::codec_context ctx;  // Note [codec context]
    ctx.bulk = im.bulk.get();
    ctx.shm = detail::same_host(node, im.sys->node());
    ctx.peer = &node;
    ctx.devices = &devices;
    ctx.scope = intercepted.get();
    ctx.work = im.exec.get();
    ctx.gather = blocking ? &borrowed : nullptr;
    std::optional<rpc::scope_guard> active;
    rpc::detail::guarded("enter", [&] { active.emplace(intercepted.get()); });
    payload = encode(ctx);
    if (!devices.kept().empty()) st->hold_until_complete(std::move(devices.kept()));
    if (intercepted) meta = rpc::detail::guarded("take_meta", [&] { return intercepted->take_meta(); });
    st->set_scope(std::move(intercepted));
  } catch (const rpc::detail::interceptor_failure& e) {
    st->complete(e.code(), st->what() + ": " + e.message(), {});
    return st;
  } catch (const error& e) {
    const errc code = e.code() == errc::device_mismatch ? e.code() : errc::bad_argument;  // Note [rpc device map]
    st->complete(code, st->what() + ": cannot encode the arguments: " + e.what(), {});
    return st;
  } catch (const std::exception& e) {
    st->complete(errc::bad_argument, st->what() + ": cannot encode the arguments: " + e.what(), {});
    return st;
  }
  // Note [direct channel]; its stop() fails the calls it holds.
  im.channel->call(peer.conn, st, function, std::move(payload), std::move(meta), std::move(borrowed));
  return st;
}

void node::set_interceptor(std::shared_ptr<rpc::call_interceptor> interceptor) { impl_->interceptor->set(std::move(interceptor)); }

void node::shutdown(shutdown_mode mode, std::chrono::milliseconds timeout) {
  auto& im = *impl_;
  if (im.down) return;
  std::optional<error> failed;
  if (mode == shutdown_mode::graceful && im.store) {
    try {
      im.store->barrier("troupe/shutdown", im.me.rank, im.me.world_size, timeout);
      // Rank 0 hosts the store: it leaves only after every other rank has its barrier answer.
      if (im.me.rank == 0) {
        std::vector<std::string> keys;
        for (int r = 1; r < im.me.world_size; ++r) keys.push_back("troupe/left/" + std::to_string(r));
        if (!keys.empty()) im.store->wait(keys, timeout);
      } else {
        im.store->set("troupe/left/" + std::to_string(im.me.rank), "1");
      }
    } catch (const error& e) {
      failed = error(e.code(), "graceful shutdown of " + im.me.name + ": " + e.message());
    }
  }
  im.teardown();
  if (failed) throw *failed;
}

}  // namespace troupe
