#pragma once
/// \file worker_info.hpp
/// The identity of one node of a job: its name, rank and the world size.

#include <cstdint>
#include <string>

namespace troupe {

/// Identity of a worker (one node = one process). Names are unique within a job ("worker3").
struct worker_info {
  std::string name;
  std::int32_t rank = 0;
  std::int32_t world_size = 1;
};

/// The CAF inspection of worker_info lives in messages.hpp (keeps CAF out of this header).

}  // namespace troupe
