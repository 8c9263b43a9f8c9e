// The distributed autograd service actor (Note [dist autograd service] in service.hpp).
#include "service.hpp"

#include <bit>
#include <thread>

#include <caf/all.hpp>

#include "troupe/actors/error_caf.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::dist_autograd {

namespace {

struct service_state {
  std::weak_ptr<container::impl> c;
  std::thread::id home;  // the detached actor's own thread
  static inline const char* name = "troupe.dist_autograd.service";
};
using service_self = service_local::stateful_pointer<service_state>;

/// An answer_once that delivers `rp` with the converted answer: at once on the service's own
/// thread, else as a service_job to it.
template <class T, class Reply, class Convert>
answer_ptr<T> deliverer(service_self self, caf::typed_response_promise<Reply> rp, T fallback, Convert convert) {
  const std::thread::id home = self->state.home;
  const caf::actor_addr addr = self->address();
  return std::make_shared<answer_once<T>>(
      [home, addr, rp, convert](const T& a) {
        auto p = rp;
        if (std::this_thread::get_id() == home) {
          p.deliver(convert(a));
          return;
        }
        if (auto me = caf::actor_cast<service_local>(addr))
          caf::anon_send(me, service_job{[p, reply = convert(a)]() mutable { p.deliver(std::move(reply)); }});
      },
      std::move(fallback));
}

/// Runs an optimizer message's work on the container; its error as the reply's error.
template <class F>
caf::result<optim_reply> owner_call(service_self self, F work) {
  auto c = self->state.c.lock();
  if (!c) return to_caf_error(errc::invalid_state, "dist_autograd optimizer: no container on this worker");
  try {
    return optim_reply{work(*c)};
  } catch (const error& e) {
    return to_caf_error(e);
  } catch (const std::exception& e) {
    return to_caf_error(errc::remote_exception, "dist_autograd optimizer on " + c->n.info().name + ": " + e.what());
  }
}

service_local::behavior_type service(service_self self, std::weak_ptr<container::impl> weak) {
  self->state.c = std::move(weak);
  return {
      [self](propagate_request& r) {
        self->state.home = std::this_thread::get_id();
        auto rp = self->make_response_promise<propagate_reply>();
        auto c = self->state.c.lock();
        if (!c) {
          rp.deliver(propagate_reply{propagate_failed, static_cast<std::int32_t>(errc::invalid_state),
                                     "dist_autograd: no container on this worker"});
          return rp;
        }
        const propagate_answer fallback{propagate_failed, static_cast<std::int32_t>(errc::invalid_state),
                                        "dist_autograd::propagate on " + c->n.info().name + ": context " +
                                            std::to_string(r.ctx) + " ended while the propagation ran"};
        c->on_propagate(r.ctx, r.msg, r.pass, r.grads, r.retain,
                        deliverer(self, rp, fallback, [](const propagate_answer& a) { return to_reply(a); }));
        return rp;
      },
      [self](release_request& r) {
        self->state.home = std::this_thread::get_id();
        auto rp = self->make_response_promise<release_reply>();
        auto c = self->state.c.lock();
        if (!c) {
          rp.deliver(release_reply{0});
          return rp;
        }
        c->serve_release(r.ctx, r.from,
                         deliverer(self, rp, std::int32_t{0}, [](const std::int32_t& n) { return release_reply{n}; }));
        return rp;
      },
      [self](optim_create& r) -> caf::result<optim_reply> {
        return owner_call(self, [&](container::impl& c) {
          std::vector<double> h;
          for (auto b : r.hyper_bits) h.push_back(std::bit_cast<double>(b));
          create_optimizer(c, r.id, r.kind, h, r.keys);
          return std::int32_t{0};
        });
      },
      [self](optim_step& r) -> caf::result<optim_reply> {
        return owner_call(self, [&](container::impl& c) { return step_optimizer(c, r.id, r.ctx); });
      },
      [self](optim_drop& r) -> caf::result<optim_reply> {
        return owner_call(self, [&](container::impl& c) {
          drop_optimizer(c, r.id);
          return std::int32_t{0};
        });
      },
      [self](service_job& j) {
        self->state.home = std::this_thread::get_id();
        if (j.fn) j.fn();
      },
  };
}

}  // namespace

service_local spawn_service(node& n, std::weak_ptr<container::impl> c) {
  return n.system().spawn<caf::detached>(service, std::move(c));
}

bool message_types_announced(node& n) {
  auto& types = n.system().types();
  return types.portable_name(0, &typeid(propagate_request)) == "troupe.dist_autograd.propagate_request" &&
         types.portable_name(0, &typeid(propagate_reply)) == "troupe.dist_autograd.propagate_reply" &&
         types.portable_name(0, &typeid(release_request)) == "troupe.dist_autograd.release_request" &&
         types.portable_name(0, &typeid(release_reply)) == "troupe.dist_autograd.release_reply" &&
         types.portable_name(0, &typeid(optim_create)) == "troupe.dist_autograd.optim_create" &&
         types.portable_name(0, &typeid(optim_step)) == "troupe.dist_autograd.optim_step" &&
         types.portable_name(0, &typeid(optim_drop)) == "troupe.dist_autograd.optim_drop" &&
         types.portable_name(0, &typeid(optim_reply)) == "troupe.dist_autograd.optim_reply";
}

void add_message_types(node_options& opts) {
  opts.actor_setup.push_back([](caf::actor_system_config& cfg) {
    cfg.add_message_type<propagate_request>("troupe.dist_autograd.propagate_request");
    cfg.add_message_type<propagate_reply>("troupe.dist_autograd.propagate_reply");
    cfg.add_message_type<release_request>("troupe.dist_autograd.release_request");
    cfg.add_message_type<release_reply>("troupe.dist_autograd.release_reply");
    cfg.add_message_type<optim_create>("troupe.dist_autograd.optim_create");
    cfg.add_message_type<optim_step>("troupe.dist_autograd.optim_step");
    cfg.add_message_type<optim_drop>("troupe.dist_autograd.optim_drop");
    cfg.add_message_type<optim_reply>("troupe.dist_autograd.optim_reply");
  });
}

}  // namespace troupe::dist_autograd
