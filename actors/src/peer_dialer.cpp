// Dialling a peer's gate and saying hello to its agent (Note [hello retry] in peer_dialer.hpp).
#include "peer_dialer.hpp"

#include <algorithm>
#include <set>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "caf_gate.hpp"
#include "troupe/actors/error_caf.hpp"

namespace troupe::detail {

namespace {
using clock = std::chrono::steady_clock;

// What is left until `end`, at least 1 ms.
std::chrono::milliseconds left_until(clock::time_point end) {
  return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(end - clock::now()), std::chrono::milliseconds(1));
}
}  // namespace

hello_ack peer_dialer::say_hello(const caf::actor& remote, std::chrono::milliseconds timeout) {
  caf::scoped_actor self{*cfg_.sys};
  hello_ack ack;
  caf::error err;
  self->request(remote, timeout, hello{cfg_.token, cfg_.me, cfg_.agent, cfg_.bulk->probe()})
      .receive([&](hello_ack& a) { ack = std::move(a); }, [&](caf::error& e) { err = std::move(e); });
  if (err) throw from_caf_error(err, "hello from " + cfg_.me.name);
  return ack;
}

// Note [CAF port gate]: the gate hello first. Then the socket goes to our BASP broker, which
// answers with the agent published behind the peer's gate. One attempt, bounded by `timeout`;
// null (and `failed`) when it fails. An unauthorized gate throws.
caf::actor peer_dialer::attempt(const std::string& host, std::uint16_t p, std::chrono::milliseconds timeout, dial_failure& failed) {
  std::string& why = failed.why;
  try {
    const int fd = caf_gate::enter(host, p, cfg_.token, timeout, cfg_.tls);
    failed.admitted = true;
    caf::scoped_actor self{*cfg_.sys};
    caf::actor result;
    self->request(cfg_.basp, timeout, caf::connect_atom::value, cfg_.sys->middleman().backend().new_scribe(fd), p)
        .receive(
            [&](caf::node_id&, caf::strong_actor_ptr& addr, std::set<std::string>&) {
              result = caf::actor_cast<caf::actor>(addr);
              if (!result) why = "no agent behind the gate";
            },
            [&](caf::error& e) { why = cfg_.sys->render(e); });
    return result;
  } catch (const error& e) {
    if (e.code() == errc::unauthorized) throw error(errc::unauthorized, cfg_.me.name + ": " + e.message());
    why = e.message();
    return {};
  }
}

// Retries with backoff until the deadline: the peer may not be listening yet (a start-up race).
caf::actor peer_dialer::connect(const std::string& host, std::uint16_t p, std::chrono::milliseconds timeout) {
  const auto end = clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(5);
  for (;;) {
    // One attempt gets at least a second (on a loaded machine); a refused connection still
    // fails at once.
    const auto left = std::max(left_until(end), std::chrono::milliseconds(1000));
    dial_failure failed;
    if (auto result = attempt(host, p, left, failed)) return result;
    if (clock::now() + backoff >= end)
      throw error(errc::peer_lost, cfg_.me.name + ": cannot connect to " + host + ":" + std::to_string(p) + ": " + failed.why);
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

// Dials through the gate until `timeout`. A dial that the gate refused or left unanswered ends
// the try. A frozen peer's kernel still accepts the TCP connection, so only the bound ends that
// wait. A dial that the gate admitted reached a live process, so a failed CAF handshake
// behind it is dialled again (Note [CAF connect tick]).
caf::actor peer_dialer::connect_once(const std::string& host, std::uint16_t p, std::chrono::milliseconds timeout) {
  const auto end = clock::now() + timeout;
  for (;;) {
    dial_failure failed;
    if (auto remote = attempt(host, p, left_until(end), failed)) return remote;
    if (!failed.admitted || clock::now() + std::chrono::milliseconds(5) >= end)
      throw error(errc::peer_lost, cfg_.me.name + ": cannot connect to " + host + ":" + std::to_string(p) + ": " + failed.why);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // a retry pace
  }
}

hello_ack peer_dialer::greet(const std::string& peer, const std::string& host, std::uint16_t p, std::chrono::milliseconds timeout, bool once) {
  const auto end = clock::now() + timeout;
  auto per_hello = std::chrono::milliseconds(500);
  caf::actor tried;  // the greeter's agent we said hello to last
  for (;;) {
    caf::actor remote = peer.empty() ? caf::actor{} : greeted_by(peer);  // Note [greeted peers]
    if (remote && remote == tried) remote = nullptr;
    if (remote) tried = remote;
    else remote = once ? connect_once(host, p, left_until(end)) : connect(host, p, left_until(end));
    try {
      return say_hello(remote, std::min(per_hello, left_until(end)));
    } catch (const error& e) {
      if (e.code() == errc::unauthorized || clock::now() + std::chrono::milliseconds(10) >= end) throw;
    }
    per_hello = std::min(per_hello * 2, std::chrono::milliseconds(4000));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // lets the redundant connection's close arrive
  }
}

void peer_dialer::greeted(const std::string& peer, const caf::actor& agent) {
  std::lock_guard<std::mutex> lock(mutex_);
  greeted_[peer] = agent;
}

void peer_dialer::forget(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  greeted_.erase(peer);
}

void peer_dialer::forget_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  greeted_.clear();
}

caf::actor peer_dialer::greeted_by(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = greeted_.find(peer);
  return it == greeted_.end() ? caf::actor{} : it->second;
}

}  // namespace troupe::detail
