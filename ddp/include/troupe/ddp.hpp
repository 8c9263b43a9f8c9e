#pragma once
/// \file ddp.hpp
/// Data-parallel training in one include: process groups (shared memory, TCP, NCCL), the file
/// store and DistributedDataParallel, with local autograd and the runtime they build on.
/// Link `troupe::ddp`.

#include "troupe/actors.hpp"
#include "troupe/autograd.hpp"
#include "troupe/ddp/checkpointer.hpp"
#include "troupe/ddp/collective_group.hpp"
#include "troupe/ddp/distributed_data_parallel.hpp"
#include "troupe/ddp/file_store.hpp"
#include "troupe/ddp/live_group.hpp"
#include "troupe/ddp/nccl_process_group.hpp"
#include "troupe/ddp/node_faults.hpp"
#include "troupe/ddp/process_group.hpp"
#include "troupe/ddp/work.hpp"
