// actor_training: training composed of typed user actors across processes (Note [remote actors]).
// worker0 hosts a parameter-server actor ("ps") and an evaluator actor; worker1..N each host a
// trainer actor. Each is a caf::typed_actor whose interface (ps_actor, trainer_actor,
// evaluator_actor) lists its messages, tensors inside them. Trainers look the server up by name
// as a ps_actor, push gradients and pull weights as tensor messages (linear regression,
// asynchronous SGD); worker0 looks each trainer up as a trainer_actor. The evaluator monitors
// the server and every trainer, pulls the weights and reports the held-out loss, which must fall.
//
//   actor_training [--trainers N] [--steps S] [--kill-trainer-at STEP]
//
// --kill-trainer-at STEP: the last trainer's process SIGKILLs itself at that step; the server
// and the evaluator print the down_msg they get (worker and cause) and the others finish.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include <caf/all.hpp>

#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/remote_actor.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

using join_atom = caf::atom_constant<caf::atom("join")>;
using pull_atom = caf::atom_constant<caf::atom("pull")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using watch_atom = caf::atom_constant<caf::atom("watch")>;
using eval_atom = caf::atom_constant<caf::atom("eval")>;

/// A trainer's gradient for one step (a user message type with a tensor inside).
struct grad_push {
  std::int64_t step = 0;
  std::string worker;
  tensor grad;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, grad_push& x) {
  return f(caf::meta::type_name("grad_push"), x.step, x.worker, x.grad);
}

/// The parameter server: a trainer joins (its worker name) and gets the weights; a push applies
/// a gradient and answers the new weights; a pull answers the weights.
using ps_actor = caf::typed_actor<caf::replies_to<join_atom, std::string>::with<tensor>,
                                  caf::replies_to<grad_push>::with<tensor>,
                                  caf::replies_to<pull_atom>::with<tensor>>;
/// A trainer: each step message runs one step (push, then the next step), until --steps.
using trainer_actor = caf::typed_actor<caf::reacts_to<step_atom>>;
/// The evaluator, local to worker0: watch monitors a trainer; eval answers the first and the
/// latest held-out loss.
using evaluator_actor = caf::typed_actor<caf::reacts_to<watch_atom, trainer_actor, std::string>,
                                         caf::replies_to<eval_atom>::with<double, double>>;

constexpr std::int64_t features = 10;
constexpr double lr = 0.02;

struct options {
  int trainers = 2;
  int steps = 60;
  int kill_at = 0;  // 0: nobody is killed
};

void usage() {
  std::puts(
      "usage: actor_training [--trainers N] [--steps S] [--kill-trainer-at STEP]\n"
      "  A parameter-server actor and an evaluator actor on worker0, one trainer actor on each of\n"
      "  worker1..N (forked processes). Trainers look the server up by name, push gradients and pull\n"
      "  weights as tensor messages; the evaluator monitors the server and the trainers and prints\n"
      "  the held-out loss, which must fall.\n"
      "  --trainers N           trainer processes (1..8, default 2)\n"
      "  --steps S              steps per trainer (>= 10, default 60)\n"
      "  --kill-trainer-at STEP the last trainer's process is SIGKILLed at that step; the server and\n"
      "                         the evaluator report its down_msg (worker, cause), the others go on");
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      usage();
      std::exit(0);
    }
    if (i + 1 >= argc) throw error(errc::bad_argument, "actor_training: " + k + " needs a value (see --help)");
    const int v = std::atoi(argv[++i]);
    if (k == "--trainers") o.trainers = v;
    else if (k == "--steps") o.steps = v;
    else if (k == "--kill-trainer-at") o.kill_at = v;
    else throw error(errc::bad_argument, "actor_training: unknown option " + k + " (see --help)");
  }
  if (o.trainers < 1 || o.trainers > 8 || o.steps < 10 || o.kill_at < 0 || o.kill_at > o.steps)
    throw error(errc::bad_argument, "actor_training: need 1 <= --trainers <= 8, --steps >= 10, 0 <= --kill-trainer-at <= steps");
  if (o.kill_at > 0 && o.trainers < 2) throw error(errc::bad_argument, "actor_training: --kill-trainer-at needs 2 trainers or more");
  return o;
}

struct port_pipe {
  std::array<int, 2> fd{-1, -1};
  port_pipe() {
    if (::pipe(fd.data()) != 0) throw error(errc::io_error, "actor_training: pipe() failed");
  }
  ~port_pipe() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
  void send(std::uint16_t port, int n) {
    for (int i = 0; i < n; ++i)
      if (::write(fd[1], &port, sizeof port) != sizeof port) throw error(errc::io_error, "actor_training: pipe write");
  }
  std::uint16_t receive() {
    pollfd p{fd[0], POLLIN, 0};
    std::uint16_t port = 0;
    if (::poll(&p, 1, 20000) != 1 || ::read(fd[0], &port, sizeof port) != sizeof port)
      throw error(errc::timeout, "actor_training: no port from worker0 within 20 s");
    return port;
  }
};

node_options node_opts(int rank, const options& o, std::uint16_t port) {
  node_options no;
  no.rank = rank;
  no.world_size = o.trainers + 1;
  no.master_port = port;
  no.job_token = "actor_training";
  add_actor_message_type<grad_push>(no, "grad_push");
  return no;
}

std::string describe(const caf::error& e) { return e ? from_caf_error(e, "down").message() : std::string("finished (normal exit)"); }

// ---- worker0: the parameter server and the evaluator ----

/// How many failure down_msg the server and the evaluator printed; worker0 finishes only after both
/// reported a killed trainer, however early the other trainers are done.
using down_count = std::shared_ptr<std::atomic<int>>;

struct ps_state {
  tensor w;
  std::map<caf::actor_addr, std::string> trainers;
};

ps_actor::behavior_type parameter_server(ps_actor::stateful_pointer<ps_state> self, down_count downs) {
  generator g(1);
  self->state.w = randn({features, 1}, g, {}, 0.0, 0.1);
  self->set_down_handler([self, downs](const caf::down_msg& d) {
    std::printf("server: trainer on %s is down: %s\n", self->state.trainers[d.source].c_str(), describe(d.reason).c_str());
    std::fflush(stdout);
    if (d.reason) ++*downs;  // a failure, not a trainer that finished
  });
  return {
      [self](join_atom, const std::string& worker) {
        self->state.trainers[self->current_sender()->address()] = worker;
        self->monitor(caf::actor_cast<caf::actor>(self->current_sender()));
        return self->state.w.clone();
      },
      [self](const grad_push& g) {
        self->state.w = self->state.w - g.grad * lr;
        return self->state.w.clone();
      },
      [self](pull_atom) { return self->state.w.clone(); },
  };
}

struct eval_state {
  tensor x, y;
  double first = -1, last = -1;
  std::map<caf::actor_addr, std::string> watched;
};

evaluator_actor::behavior_type evaluator(evaluator_actor::stateful_pointer<eval_state> self, ps_actor ps, down_count downs) {
  generator data(7), truth(42);
  const tensor w_true = randn({features, 1}, truth);
  self->state.x = randn({256, features}, data);
  self->state.y = matmul(self->state.x, w_true);
  self->monitor(ps);
  self->state.watched[ps.address()] = "the parameter server (worker0)";
  self->set_down_handler([self, downs](const caf::down_msg& d) {
    std::printf("evaluator: %s is down: %s\n", self->state.watched[d.source].c_str(), describe(d.reason).c_str());
    std::fflush(stdout);
    if (d.reason) ++*downs;  // a failure, not a trainer that finished
  });
  return {
      [self](watch_atom, const trainer_actor& trainer, const std::string& worker) {
        self->monitor(trainer);
        self->state.watched[trainer.address()] = "the trainer on " + worker;
      },
      [self, ps](eval_atom) {
        auto rp = self->make_response_promise<double, double>();
        self->request(ps, 10s, pull_atom::value)
            .then(
                [self, rp](const tensor& w) mutable {
                  const tensor r = matmul(self->state.x, w) - self->state.y;
                  const double loss = mean(r * r).item();
                  if (self->state.first < 0) self->state.first = loss;
                  self->state.last = loss;
                  std::printf("evaluator: held-out loss %.5f\n", loss);
                  std::fflush(stdout);
                  rp.deliver(self->state.first, self->state.last);
                },
                [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
        return rp;
      },
  };
}

// ---- worker1..N: trainers ----

struct trainer_state {
  tensor w;
  std::int64_t step = 0;
};

trainer_actor::behavior_type trainer(trainer_actor::stateful_pointer<trainer_state> self, ps_actor ps, std::string worker, options o,
                                     bool victim) {
  auto data = std::make_shared<generator>(static_cast<std::uint64_t>(100 + worker.size() + worker.back()));
  auto w_true = std::make_shared<tensor>();
  generator truth(42);
  *w_true = randn({features, 1}, truth);
  return {
      [=](step_atom) {
        auto& s = self->state;
        if (!s.w.defined()) {  // first step: join the server, take its weights
          self->request(ps, 10s, join_atom::value, worker).then([self](const tensor& w) {
            self->state.w = w;
            self->send(self, step_atom::value);
          });
          return;
        }
        if (++s.step > o.steps) return self->quit();
        if (victim && s.step == o.kill_at) {
          std::printf("trainer on %s: killing my process at step %lld\n", worker.c_str(), static_cast<long long>(s.step));
          std::fflush(stdout);
          ::raise(SIGKILL);
        }
        const tensor x = randn({32, features}, *data);
        const tensor r = matmul(x, s.w) - matmul(x, *w_true);
        const tensor grad = matmul(x.t(), r) * (2.0 / 32);
        self->request(ps, 10s, grad_push{s.step, worker, grad})
            .then([self](const tensor& w) {
              self->state.w = w;
              self->send(self, step_atom::value);
            });
      },
  };
}

void run_trainer(int rank, const options& o, port_pipe& pipe) {
  node n(node_opts(rank, o, pipe.receive()));
  {
    auto ps = lookup_actor<ps_actor>(n, "worker0", "ps", 20s);
    const bool victim = o.kill_at > 0 && rank == o.trainers;
    auto t = n.system().spawn(trainer, ps, n.info().name, o, victim);
    publish_actor(n, t, "trainer");
    n.store().get("go", 60s);  // the evaluator took its first measurement
    caf::scoped_actor self{n.system()};
    self->monitor(t);
    self->send(t, step_atom::value);
    self->receive([](const caf::down_msg&) {}, caf::after(std::chrono::minutes(5)) >> [] {});
  }
  n.store().set("done/" + std::to_string(rank), "1");
  n.store().get("finish", 5min);
  n.store().set("left/" + std::to_string(rank), "1");  // worker0 hosts the store: it waits for this
  n.shutdown(shutdown_mode::immediate);
}

void run_server(const options& o, port_pipe& pipe) {
  node n(node_opts(0, o, 0));
  pipe.send(n.port(), o.trainers);
  double first = -1, last = -1;
  std::vector<std::string> done, left;
  {
    auto downs = std::make_shared<std::atomic<int>>(0);
    auto ps = n.system().spawn(parameter_server, downs);
    publish_actor(n, ps, "ps");
    auto ev = n.system().spawn(evaluator, ps, downs);
    for (int r = 1; r <= o.trainers; ++r) {
      const auto worker = "worker" + std::to_string(r);
      caf::anon_send(ev, watch_atom::value, lookup_actor<trainer_actor>(n, worker, "trainer", 20s), worker);
    }
    caf::scoped_actor self{n.system()};
    for (int r = 1; r <= o.trainers; ++r)
      if (!(o.kill_at > 0 && r == o.trainers)) {
        done.push_back("done/" + std::to_string(r));
        left.push_back("left/" + std::to_string(r));
      }
    self->request(ev, 10s, eval_atom::value).receive([&](double f, double l) { first = f, last = l; }, [](caf::error&) {});
    n.store().set("go", "1");
    // The others may finish before the victim reaches its step: the killed trainer must also be
    // reported by the server and the evaluator (two down_msg) before worker0 stops them.
    const int downs_expected = o.kill_at > 0 ? 2 : 0;
    const auto deadline = std::chrono::steady_clock::now() + 3min;
    for (bool finished = false; !finished;) {
      self->request(ev, 10s, eval_atom::value).receive([&](double f, double l) { first = f, last = l; }, [](caf::error&) {});
      try {
        n.store().wait(done, 20ms);
        finished = *downs >= downs_expected;
      } catch (const error& e) {
        if (e.code() != errc::timeout) throw;
      }
      if (!finished && std::chrono::steady_clock::now() > deadline)
        throw error(errc::timeout, "actor_training: the trainers did not finish, or the killed trainer was not reported down, within 3 min");
    }
    self->request(ev, 10s, eval_atom::value).receive([&](double f, double l) { first = f, last = l; }, [](caf::error&) {});
    self->send_exit(ev, caf::exit_reason::user_shutdown);
    self->send_exit(ps, caf::exit_reason::user_shutdown);
  }
  n.store().set("finish", "1");
  n.store().wait(left, 20s);
  if (!(last < 0.5 * first))
    throw error(errc::invalid_state, "actor_training: the held-out loss did not fall (" + std::to_string(first) + " -> " + std::to_string(last) + ")");
  std::printf("actor_training: the held-out loss fell from %.5f to %.5f\n", first, last);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    port_pipe pipe;
    auto children = spawn(o.trainers, [&](int r) { run_trainer(r + 1, o, pipe); });
    run_server(o, pipe);
    try {
      children.join(60s);
    } catch (const error& e) {
      if (o.kill_at == 0) throw;
      std::printf("actor_training: as asked, one trainer died: %s\n", e.message().c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "actor_training: %s\n", e.what());
    return 1;
  }
}
