#pragma once
// The rule keys of collective payloads (Note [collective payload faults] in
// ddp/src/payload_faults.hpp): `collective`, then any of `:KIND`, `:seq=N`, `:rank=R`,
// `:bucket=B`, each narrowing the match. KIND is a collective (allreduce, broadcast, allgather,
// reduce_scatter, reduce, gather, scatter, all_to_all, barrier) or `send`. Examples:
//   collective                          every payload of every rank
//   collective:allreduce:seq=3:rank=1   rank 1's payload of allreduce #3
//   collective:bucket=0                 every payload of DDP bucket 0's allreduces

#include <string_view>

#include "troupe/actors/fault_plan.hpp"

namespace troupe::detail {

/// Whether `match` is a collective key ("collective" or "collective:...").
bool is_collective_key(std::string_view match) noexcept;
/// Throws bad_argument naming `line` when the key of `r` is malformed, or when `r` asks for
/// drop_reply (a collective has no reply).
void check_collective_rule(const fault_rule& r, int line);
/// Whether the collective key `match` matches `msg` (message_kind::collective_payload).
bool collective_key_matches(std::string_view match, const envelope& msg);

}  // namespace troupe::detail
