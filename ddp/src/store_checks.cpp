// Fingerprints and the monitored barrier through the store (Note [NCCL fingerprints]).
#include "store_checks.hpp"

#include <algorithm>

namespace troupe::ddp::detail {

namespace {
using clock = std::chrono::steady_clock;
constexpr const char* lost_mark = " !lost ";  // "<seq> !lost <reason>": a dropped payload

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}
}  // namespace

store_checks::store_checks(check_store store, std::string prefix, int rank, int world_size, std::string label)
    : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), world_(world_size), label_(std::move(label)) {}

std::vector<std::optional<std::string>> store_checks::exchange(const std::string& base, const std::string& mine,
                                                               std::chrono::milliseconds timeout) {
  store_.set(base + "/" + std::to_string(rank_), mine);
  const auto deadline = clock::now() + timeout;
  std::vector<std::optional<std::string>> out(static_cast<std::size_t>(world_));
  out[static_cast<std::size_t>(rank_)] = mine;
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;
    // Past the deadline each remaining key gets one short look, so every missing rank is named.
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    try {
      out[static_cast<std::size_t>(r)] = store_.get(base + "/" + std::to_string(r), std::max(left, std::chrono::milliseconds(1)));
    } catch (const troupe::error& e) {
      if (e.code() != errc::timeout) throw;
    }
  }
  return out;
}

void store_checks::erase_own(const std::string& base) {
  if (!store_.erase) return;
  try {
    store_.erase(base + "/" + std::to_string(rank_));
  } catch (const troupe::error&) {
    // a key left behind costs a little store memory, never correctness
  }
}

std::optional<troupe::error> store_checks::compare(std::uint64_t seq, const std::string& fingerprint,
                                                   std::chrono::milliseconds timeout) {
  if (world_ == 1) return std::nullopt;
  const std::string base = prefix_ + "/fp/" + std::to_string(seq);  // value: "<seq> <fingerprint>"
  std::string mine = std::to_string(seq);
  mine += ' ';
  mine += fingerprint;
  const auto all = exchange(base, mine, timeout);
  const std::string lost = std::to_string(seq) + lost_mark;
  std::vector<int> missing;
  for (int r = 0; r < world_; ++r) {
    const auto& v = all[static_cast<std::size_t>(r)];
    if (v && v->rfind(lost, 0) == 0) return troupe::error(errc::peer_lost, label_ + ": collective #" + mine + ": " + v->substr(lost.size()));
    if (!v) missing.push_back(r);
  }
  if (!missing.empty())
    return troupe::error(errc::timeout, label_ + ": collective #" + mine + ": rank(s) " + rank_list(missing) +
                                            " did not issue it within " + std::to_string(timeout.count()) +
                                            " ms (dead, hung or behind)");
  // Every rank published `seq`, so every rank read this rank's previous key.
  if (last_fp_base_) erase_own(*last_fp_base_);
  last_fp_base_ = base;
  last_mine_ = mine;
  for (int r = 0; r < world_; ++r)
    if (*all[static_cast<std::size_t>(r)] != mine)
      return troupe::error(errc::collective_mismatch, label_ + ": ranks disagree on a collective: rank " +
                                                          std::to_string(rank_) + " issued #" + mine + ", rank " +
                                                          std::to_string(r) + " issued #" + *all[static_cast<std::size_t>(r)]);
  return std::nullopt;
}

void store_checks::publish_lost(std::uint64_t seq, const std::string& reason) {
  if (world_ == 1) return;
  store_.set(prefix_ + "/fp/" + std::to_string(seq) + "/" + std::to_string(rank_), std::to_string(seq) + lost_mark + reason);
}

void store_checks::repeat_last() {
  if (last_fp_base_) store_.set(*last_fp_base_ + "/" + std::to_string(rank_), last_mine_);
}

void store_checks::monitored_barrier(std::chrono::milliseconds timeout) {
  if (world_ == 1) return;
  const std::uint64_t k = barriers_++;
  const std::string base = prefix_ + "/mb/" + std::to_string(k);
  const auto all = exchange(base, "arrived", timeout);
  std::vector<int> missing;
  for (int r = 0; r < world_; ++r)
    if (!all[static_cast<std::size_t>(r)]) missing.push_back(r);
  if (!missing.empty())
    throw troupe::error(errc::timeout, label_ + ": monitored_barrier #" + std::to_string(k) + ": rank(s) " +
                                           rank_list(missing) + " did not arrive within " + std::to_string(timeout.count()) + " ms");
  if (k > 0) erase_own(prefix_ + "/mb/" + std::to_string(k - 1));
}

}  // namespace troupe::ddp::detail
