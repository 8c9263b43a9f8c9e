#pragma once
// The leak check of a forked child that leaves with _exit (Note [leak check in children]).

// Note [leak check in children]
//
// A child leaves with _exit, which skips LeakSanitizer's check at exit. So a sanitizer build
// runs it by hand: after the child's work returned (its objects destroyed), what is still
// allocated and unreachable is a leak. A child with leaks fails with exit code `leak_exit_code`
// (unless it failed already) and the report is on its stderr. What it inherited from the parent
// is checked too, reachable from the parent's globals as there. Without a sanitizer the status
// is left as it is. Used by spawn() (spawn.cpp) and the ranks of run_cluster (testing/cluster.cpp).

#if defined(__SANITIZE_ADDRESS__)
#define TROUPE_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer)
#define TROUPE_LSAN 1
#endif
#endif
#ifdef TROUPE_LSAN
#include <sanitizer/lsan_interface.h>
#endif

namespace troupe::detail {

inline constexpr int leak_exit_code = 23;  // LeakSanitizer's own exit code

/// `status`, or `leak_exit_code` when it is 0 and a sanitizer build finds a leak now.
inline int leak_checked(int status) noexcept {
#ifdef TROUPE_LSAN
  if (__lsan_do_recoverable_leak_check() != 0 && status == 0) return leak_exit_code;
#endif
  return status;
}

}  // namespace troupe::detail
