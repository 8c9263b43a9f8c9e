#pragma once
// Accepting on a listener without spinning, and the bounds on connections that have not
// authenticated yet (Note [connection hygiene]).
//
// Note [connection hygiene]
// A listener (the direct rpc port, the CAF port's gate) admits connections under three bounds:
//   * a connection that has not authenticated within auth_deadline is closed;
//   * at most max_unauthenticated connections wait to authenticate. A new one closes the
//     oldest waiting one. A real peer authenticates in milliseconds, so it is never the oldest;
//   * before authentication, a connection is read at most a small bound: one auth frame or
//     hello, a few KiB. So no peer can make the node allocate more than that per connection.
// accept() may fail for want of resources (EMFILE, ENFILE, ENOBUFS, ENOMEM). Then accepting
// pauses with a backoff from 50 ms to 1 s. The listener is not polled meanwhile, so the I/O
// thread does not spin, and connected peers are still served. New connections wait in the
// kernel's backlog. Each such episode is said once on stderr, with the reason, and its end once
// too. Connections closed by the deadline or the cap are said at most once a second, with a
// count.

#include <chrono>
#include <cstddef>
#include <string>

namespace troupe::detail {

/// Accept-side bookkeeping of one listener. One thread uses it.
class accept_guard {
 public:
  using clock = std::chrono::steady_clock;
  /// `who` names the node and `what` the listener in the lines on stderr.
  accept_guard(std::string who, std::string what);

  /// Accepts one connection (non-blocking, close-on-exec) and returns its fd. Returns -1 when
  /// there is none now, or when accepting is paused (resource shortage: the pause starts here
  /// and is logged).
  int accept_one(int listen_fd);
  /// Whether the listener should be polled now.
  bool accepting(clock::time_point now) const { return now >= resume_at_; }
  /// When accepting resumes (in the past while accepting).
  clock::time_point resume_at() const { return resume_at_; }
  /// Says on stderr (at most once a second, with a count) that a waiting connection was closed:
  /// `expired` by the deadline, otherwise by the cap.
  void closed_waiting(bool expired);
  /// Says on stderr (at most once a second, with a count) that a connection was refused and why.
  void refused(const char* why);

 private:
  std::string who_, what_;
  clock::time_point resume_at_{};
  std::chrono::milliseconds backoff_{0};
  bool short_of_resources_ = false;
  clock::time_point last_said_{};
  std::size_t unsaid_expired_ = 0, unsaid_evicted_ = 0;
  clock::time_point last_refused_{};
  std::size_t unsaid_refused_ = 0;
};

}  // namespace troupe::detail
