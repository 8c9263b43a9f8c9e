// The NCCL backend's shared pieces: checked calls, the communicator's abort/settle logic and the
// work handles (Note [NCCL process group] in nccl_process_group.hpp). Builds without NCCL get
// handles that are always empty.
#include "troupe/ddp/nccl_process_group.hpp"

#if defined(TROUPE_WITH_NCCL)

#include <thread>

#include "nccl_comm.hpp"
#include "work_state.hpp"

namespace troupe::ddp {

bool nccl_compiled() noexcept { return true; }

namespace nccl_detail {

troupe::error nccl_error(ncclResult_t r, const std::string& context, const char* call, const char* file, int line) {
  const char* last = ncclGetLastError(nullptr);  // the comm argument is unused by NCCL
  std::string msg = context.empty() ? std::string() : context + ": ";
  msg += std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " + ncclGetErrorString(r);
  if (last != nullptr && *last != '\0') msg += " (" + std::string(last) + ")";
  return troupe::error(errc::nccl_failure, std::move(msg));
}

void throw_nccl_error(ncclResult_t r, const char* call, const char* file, int line) {
  throw nccl_error(r, {}, call, file, line);
}

void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line) {
  throw troupe::error(errc::cuda_failure, std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                                               cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

device_guard::device_guard(int device) {
  TROUPE_DDP_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) TROUPE_DDP_CUDA_CHECK(cudaSetDevice(device));
}

device_guard::~device_guard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) static_cast<void>(cudaSetDevice(previous_));
}

void backoff::pause() {
  if (rounds_ < 16) {
    ++rounds_;
    std::this_thread::yield();
    return;
  }
  const int shift = std::min(rounds_++ - 16, 7);  // 10 us .. 1.28 ms
  std::this_thread::sleep_for(std::chrono::microseconds(10 << shift));
}

communicator::~communicator() {
  if (comm != nullptr) static_cast<void>(ncclCommAbort(comm));
}

void communicator::abort_locked(const troupe::error& why) noexcept {
  if (!dead) dead = why;
  if (comm == nullptr) return;
  try {
    device_guard g(device);
    // The handle is freed by the call whatever it answers; its result only tells whether the
    // teardown was clean, and there is nobody left to tell.
    static_cast<void>(ncclCommAbort(comm));
  } catch (...) {
    static_cast<void>(ncclCommAbort(comm));
  }
  comm = nullptr;
}

void communicator::ensure_alive_locked(const std::string& what) const {
  if (dead) throw troupe::error(errc::invalid_state, label + ": " + what + ": the communicator was aborted: " + dead->message());
  if (comm == nullptr) throw troupe::error(errc::invalid_state, label + ": " + what + ": no communicator");
}

ncclResult_t communicator::async_error_locked() noexcept {
  if (comm == nullptr) return ncclInvalidUsage;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
  return r != ncclSuccess ? r : state;
}

void communicator::settle_locked(ncclResult_t r, const char* call, const char* file, int line, clock::time_point deadline) {
  backoff b;
  while (r == ncclInProgress) {
    if (clock::now() >= deadline) {
      troupe::error e(errc::timeout, label + ": " + call + " was still in progress at the deadline (" + file + ":" +
                                         std::to_string(line) + "); the communicator was aborted");
      abort_locked(e);
      throw e;
    }
    b.pause();
    r = async_error_locked();
  }
  if (r != ncclSuccess) {
    troupe::error e = nccl_error(r, label, call, file, line);
    abort_locked(e);
    throw e;
  }
}

work as_work(nccl_work w) {
  auto s = std::make_shared<work::state>();
  s->description = w.description();
  s->device = work::state::device_completion{[w](std::chrono::milliseconds t) { w.wait(t); },
                                             [w] { return w.is_completed(); }, [w] { return w.error(); },
                                             [w] { w.synchronize_stream(); }};
  return work(std::move(s));
}

}  // namespace nccl_detail

nccl_work::state::state(std::shared_ptr<nccl_detail::communicator> c, std::string d)
    : comm(std::move(c)), description(std::move(d)), done(comm->device) {}

void nccl_work::state::finish_locked(std::optional<troupe::error> e) {
  if (recorder && !completed) recorder->end(token, !e.has_value());
  completed = true;
  err = std::move(e);
  keep.clear();
}

bool nccl_work::state::poll() {
  std::lock_guard<std::mutex> lock(mu);
  if (completed) return true;
  {
    std::lock_guard<std::mutex> comm_lock(comm->mu);
    if (comm->dead) {
      finish_locked(troupe::error(comm->dead->code(), description + ": the communicator was aborted: " + comm->dead->message()));
      return true;
    }
    const ncclResult_t a = comm->async_error_locked();
    if (a != ncclSuccess && a != ncclInProgress) {
      troupe::error e = nccl_detail::nccl_error(a, description, "ncclCommGetAsyncError (asynchronous error)", __FILE__, __LINE__);
      comm->abort_locked(e);
      finish_locked(e);
      return true;
    }
  }
  try {
    if (!done.query()) return false;
  } catch (const troupe::error& e) {
    std::lock_guard<std::mutex> comm_lock(comm->mu);
    comm->abort_locked(e);
    finish_locked(e);
    return true;
  }
  finish_locked(std::nullopt);
  return true;
}

void nccl_work::state::expire(const troupe::error& e) {
  std::lock_guard<std::mutex> lock(mu);
  if (completed) return;
  std::lock_guard<std::mutex> comm_lock(comm->mu);
  comm->abort_locked(e);
  finish_locked(e);
}

void nccl_work::wait(std::chrono::milliseconds timeout) const {
  if (!state_) throw troupe::error(errc::invalid_state, "nccl_work::wait on an empty work handle");
  const auto deadline = nccl_detail::clock::now() + timeout;
  nccl_detail::backoff b;
  while (!state_->poll()) {
    if (nccl_detail::clock::now() >= deadline) {
      // A no-op when it completed since the poll.
      state_->expire(troupe::error(errc::timeout, state_->description + " did not complete within " +
                                                      std::to_string(timeout.count()) + " ms; the communicator was aborted"));
      break;
    }
    b.pause();
  }
  if (auto e = error()) throw *e;
  synchronize_stream();
}

void nccl_work::synchronize_stream() const {
  if (!state_) throw troupe::error(errc::invalid_state, "nccl_work::synchronize_stream on an empty work handle");
  state_->done.wait(cuda::current_stream(state_->comm->device));
}

bool nccl_work::is_completed() const { return state_ && state_->poll(); }

std::optional<troupe::error> nccl_work::error() const {
  if (!state_) return std::nullopt;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->err;
}

std::string nccl_work::description() const { return state_ ? state_->description : std::string("(empty nccl_work)"); }

}  // namespace troupe::ddp

#else  // a build without NCCL: no work is ever created

namespace troupe::ddp {

struct nccl_work::state {};

bool nccl_compiled() noexcept { return false; }

void nccl_work::wait(std::chrono::milliseconds) const {
  throw troupe::error(errc::invalid_state, "nccl_work::wait on an empty work handle (this build has no NCCL)");
}
void nccl_work::synchronize_stream() const {
  throw troupe::error(errc::invalid_state, "nccl_work::synchronize_stream on an empty work handle (this build has no NCCL)");
}
bool nccl_work::is_completed() const { return false; }
std::optional<troupe::error> nccl_work::error() const { return std::nullopt; }
std::string nccl_work::description() const { return "(empty nccl_work)"; }

}  // namespace troupe::ddp

#endif
