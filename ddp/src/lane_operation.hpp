#pragma once
// The operation a lane of a process group runs, as its transport sees it.

#include <chrono>
#include <string>

namespace troupe::ddp::detail {

/// The worker threads of a process group: one each for collectives, sends and receives.
enum class lane { collectives = 0, sends = 1, receives = 2 };
inline constexpr int lane_count = 3;

/// The operation a lane runs now: its name for error messages and its deadline. A transport
/// keeps one per lane; only that lane's thread touches it.
struct lane_operation {
  std::string what;
  std::chrono::steady_clock::time_point deadline{};
  std::chrono::steady_clock::time_point next_check{};  ///< shared memory: the next peer check
};

}  // namespace troupe::ddp::detail
