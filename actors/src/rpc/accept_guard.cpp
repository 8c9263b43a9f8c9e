// Accepting without spinning (Note [connection hygiene] in rpc/accept_guard.hpp).
#include "rpc/accept_guard.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

namespace troupe::detail {

namespace {
constexpr std::chrono::milliseconds first_backoff{50};
constexpr std::chrono::milliseconds max_backoff{1000};
constexpr std::chrono::seconds say_every{1};

bool resource_shortage(int e) { return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM; }
}  // namespace

accept_guard::accept_guard(std::string who, std::string what) : who_(std::move(who)), what_(std::move(what)) {}

int accept_guard::accept_one(int listen_fd) {
  for (;;) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      if (short_of_resources_)
        std::fprintf(stderr, "[troupe] %s: accepting %s connections again\n", who_.c_str(), what_.c_str());
      short_of_resources_ = false;
      backoff_ = std::chrono::milliseconds(0);
      return fd;
    }
    const int e = errno;
    if (e == EINTR || e == ECONNABORTED) continue;
    if (!resource_shortage(e)) return -1;  // EAGAIN: nothing waits
    if (!short_of_resources_)
      std::fprintf(stderr, "[troupe] %s: refusing new %s connections: accept failed (%s); connected peers are still served\n",
                   who_.c_str(), what_.c_str(), std::strerror(e));
    short_of_resources_ = true;
    backoff_ = std::clamp(backoff_ * 2, first_backoff, max_backoff);
    resume_at_ = clock::now() + backoff_;
    return -1;
  }
}

void accept_guard::closed_waiting(bool expired) {
  ++(expired ? unsaid_expired_ : unsaid_evicted_);
  const auto now = clock::now();
  if (now - last_said_ < say_every) return;
  last_said_ = now;
  std::fprintf(stderr, "[troupe] %s: closed %zu %s connections that did not authenticate in time and %zu beyond the cap\n", who_.c_str(),
               unsaid_expired_, what_.c_str(), unsaid_evicted_);
  unsaid_expired_ = unsaid_evicted_ = 0;
}

void accept_guard::refused(const char* why) {
  ++unsaid_refused_;
  const auto now = clock::now();
  if (now - last_refused_ < say_every) return;
  last_refused_ = now;
  std::fprintf(stderr, "[troupe] %s: refused %zu %s connection(s): %s\n", who_.c_str(), unsaid_refused_, what_.c_str(), why);
  unsaid_refused_ = 0;
}

}  // namespace troupe::detail
