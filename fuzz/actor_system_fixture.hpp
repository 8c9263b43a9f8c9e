#pragma once
// The actor system of the actor_message harness and its seed writer. It announces every message
// type a node announces (register_messages, troupe.tensor) plus one user type. Its proxy
// registry makes remote_proxy objects of a remote_actors layer with no connection, so a proxy
// made while decoding sends nothing. Both sides announce the same types, as the nodes of a job do.
// The system runs no thread of its own (CAF's testing scheduler, inline logger output). What an
// input makes it do, such as a dropped proxy's cleanup, runs in the harness's thread, in
// run_jobs(). So the coverage of an input is the same on every run and machine
// (Note [deterministic fuzz round] in tools/fuzz.sh).
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/proxy_registry.hpp>
#include <caf/scheduler/test_coordinator.hpp>
#include <caf/scoped_execution_unit.hpp>

#include <memory>
#include <string>
#include <vector>

#include "remote/remote_actors.hpp"
#include "troupe/actors/messages.hpp"
#include "troupe/actors/remote_actor.hpp"
#include "troupe/actors/rpc/device_map.hpp"

namespace troupe::fuzz {

/// A user message type: a label, values and a tensor (actor messages may carry tensors).
struct user_message {
  std::string label;
  std::vector<double> values;
  tensor t;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, user_message& x) {
  return f(caf::meta::type_name("fuzz.user_message"), x.label, x.values, x.t);
}

class actor_system_fixture {
 public:
  actor_system_fixture() : sys_(configure(cfg_)), ctx_(&sys_), proxies_(sys_, *layer()) { ctx_.proxy_registry_ptr(&proxies_); }
  ~actor_system_fixture() { proxies_.clear(); }
  actor_system_fixture(const actor_system_fixture&) = delete;
  actor_system_fixture& operator=(const actor_system_fixture&) = delete;

  caf::actor_system& system() { return sys_; }
  /// The serialization context, as a node's remote_actors has it.
  caf::execution_unit* context() { return &ctx_; }
  /// Drops every proxy made so far, and runs what that scheduled.
  void forget_proxies() {
    proxies_.clear();
    run_jobs();
  }
  /// Runs every job the system has been given, in this thread.
  void run_jobs() { dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler()).run(); }

 private:
  static caf::actor_system_config& configure(caf::actor_system_config& cfg) {
    register_messages(cfg);
    cfg.add_message_type<tensor>("troupe.tensor");
    cfg.add_message_type<user_message>("fuzz.user_message");
    cfg.set("scheduler.policy", caf::atom("testing"));
    cfg.set("logger.file-verbosity", caf::atom("quiet"));
    cfg.set("logger.inline-output", true);
    cfg.set("logger.console", caf::atom("none"));
    return cfg;
  }
  detail::remote_actors* layer() {
    layer_ = std::make_shared<detail::remote_actors>(sys_, worker_info{"worker0", 0, 2}, nullptr, nullptr, maps_, nullptr);
    return layer_.get();
  }

  caf::actor_system_config cfg_;
  caf::actor_system sys_;
  caf::scoped_execution_unit ctx_;
  rpc::device_maps maps_;  // none set: outlives layer_
  std::shared_ptr<detail::remote_actors> layer_;
  caf::proxy_registry proxies_;
};

}  // namespace troupe::fuzz
