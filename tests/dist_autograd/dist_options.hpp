#pragma once
// Node options for tests that attach a dist_autograd container.

#include <cstdint>
#include <string>

#include "integration/node_harness.hpp"
#include "troupe/dist_autograd/container.hpp"

namespace troupe::test {

/// test_options with the message types of distributed autograd announced.
inline node_options dist_options(int rank, int world, std::uint16_t master_port, std::string token = "test-token") {
  auto o = test_options(rank, world, master_port, std::move(token));
  dist_autograd::add_message_types(o);
  return o;
}

}  // namespace troupe::test
