#pragma once
/// \file dist_autograd.hpp
/// Distributed autograd in one include: contexts, the distributed backward and
/// DistributedOptimizer, with local autograd and the runtime they build on.
/// Link `troupe::dist_autograd`.

#include "troupe/actors.hpp"
#include "troupe/autograd.hpp"
#include "troupe/dist_autograd/container.hpp"
#include "troupe/dist_autograd/functions.hpp"
#include "troupe/dist_autograd/optimizer.hpp"
