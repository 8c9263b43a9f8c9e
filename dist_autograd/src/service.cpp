// The distributed autograd service actor (Note [dist autograd service] in service.hpp).
#include "service.hpp"

#include <bit>

#include <caf/all.hpp>

#include "troupe/actors/error_caf.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::dist_autograd {

namespace {

struct service_state {
  std::weak_ptr<container::impl> c;
  static inline const char* name = "troupe.dist_autograd.service";
};
using service_self = service_local::stateful_pointer<service_state>;

/// An answer_once that answers the request being handled with the converted answer. It answers
/// from the thread that knows it: the service's own, or a context actor's. The reply goes
/// straight to the requester, as a response promise's would, with no hop back through the service.
template <class T, class Convert>
answer_ptr<T> deliverer(service_self self, T fallback, Convert convert) {
  caf::strong_actor_ptr to = self->current_sender();
  const caf::message_id mid = self->current_message_id();
  caf::strong_actor_ptr me = caf::actor_cast<caf::strong_actor_ptr>(self);
  return std::make_shared<answer_once<T>>(
      [to, mid, me, convert](const T& a) {
        if (to && mid.is_request()) to->enqueue(me, mid.response_id(), caf::make_message(convert(a)), nullptr);
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
      [self](propagate_request& r) -> caf::delegated<propagate_reply> {
        auto c = self->state.c.lock();
        const std::string where = c ? c->n.info().name : std::string("this worker");
        const propagate_answer fallback{propagate_failed, static_cast<std::int32_t>(errc::invalid_state),
                                        "dist_autograd::propagate on " + where + ": context " + std::to_string(r.ctx) +
                                            (c ? " ended while the propagation ran" : ": no container here")};
        auto done = deliverer(self, fallback, [](const propagate_answer& a) { return to_reply(a); });
        if (c) c->on_propagate(r.ctx, r.msg, r.pass, r.grads, r.retain, std::move(done));
        return {};  // answered through `done` (the fallback when it is dropped unanswered)
      },
      [self](release_request& r) -> caf::delegated<release_reply> {
        auto done = deliverer(self, std::int32_t{0}, [](const std::int32_t& n) { return release_reply{n}; });
        if (auto c = self->state.c.lock()) c->serve_release(r.ctx, r.from, std::move(done));
        return {};  // answered through `done`
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
