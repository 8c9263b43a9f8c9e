// Note [group peer loss] in member_watch.hpp.
#include "member_watch.hpp"

#include <map>
#include <vector>

namespace troupe::ddp::detail {

std::string member_watch::describe(int member, const peer_loss& loss) {
  return "rank " + std::to_string(member) + " (" + loss.worker + ") was lost: " + loss.reason;
}

member_watch::member_watch(const rendezvous& store, const std::string& key_prefix, int rank, int world,
                           std::chrono::milliseconds timeout, on_lost fn) {
  store.set(key_prefix + std::to_string(rank), store.events->self());
  std::map<std::string, int> members;
  std::vector<std::string> workers;
  for (int r = 0; r < world; ++r) {
    auto w = r == rank ? store.events->self() : store.get(key_prefix + std::to_string(r), timeout);
    members.emplace(w, r);
    workers.push_back(std::move(w));
  }
  sub_ = peer_events::subscribe(store.events, [rank, fn = std::move(fn), members = std::move(members)](const peer_loss& l) {
    auto it = members.find(l.worker);
    if (it == members.end() || it->second == rank) return;
    fn(it->second, l);
  });
  store.events->watch(workers, timeout);
}

}  // namespace troupe::ddp::detail
