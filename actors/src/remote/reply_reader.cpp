// A thread that reads its remote actor replies itself (Note [caller reads actor replies] in
// troupe/actors/reply_reader.hpp).
#include "troupe/actors/reply_reader.hpp"

#include <caf/actor.hpp>

#include "remote/remote_actors.hpp"
#include "rpc/direct_channel.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe {

reply_reader::reply_reader(node& n, const caf::actor& dest) {
  if (!dest) return;
  try {
    if (dest->node() == n.system().node()) return;
    auto& remote = n.remote_actors();
    conn_ = remote.channel_of(dest->node());
    channel_ = remote.channel();
  } catch (const error&) {  // no direct channel, or shut down: nothing to read
    conn_.reset();
  }
}

reply_reader::~reply_reader() = default;

bool reply_reader::read_until(const std::function<bool()>& done, std::chrono::steady_clock::time_point deadline) {
  auto channel = channel_.lock();
  return channel && conn_ && channel->read_replies(conn_, done, deadline);
}

void reply_reader::poke() {
  if (auto channel = channel_.lock(); channel && conn_) channel->poke_reader(*conn_);
}

}  // namespace troupe
