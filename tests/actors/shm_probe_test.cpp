// The shared-memory probe of Note [shm reachability] (actors/src/rpc/bulk.hpp): what a peer opens
// at the first contact to learn whether it can open this process's segments.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include "rpc/bulk.hpp"

TEST_CASE("a node's probe opens like a segment and anything else does not", "[actors][rpc][bulk]") {
  troupe::detail::bulk_names names;
  const auto p = names.probe();
  REQUIRE(p.pid == ::getpid());
  REQUIRE(p.fd >= 0);
  CHECK(p.name.rfind("troupe_rpc_probe_", 0) == 0);
  CHECK(names.probe().name == p.name);  // one probe per node
  CHECK(troupe::detail::can_open_probe(p));

  const int other = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  REQUIRE(other >= 0);
  CHECK_FALSE(troupe::detail::can_open_probe({p.pid, other, p.name}));  // a descriptor that is not that memfd
  ::close(other);
  CHECK_FALSE(troupe::detail::can_open_probe({p.pid, p.fd, p.name + "x"}));  // another name
  CHECK_FALSE(troupe::detail::can_open_probe({p.pid, p.fd, "troupe_rpc_" + std::to_string(p.pid)}));  // not a probe's name
  CHECK_FALSE(troupe::detail::can_open_probe({0, p.fd, p.name}));
  CHECK_FALSE(troupe::detail::can_open_probe({}));
}

TEST_CASE("a peer is reachable only once the handshake said so, and never with shared memory off", "[actors][rpc][bulk]") {
  troupe::detail::bulk_names names;
  CHECK_FALSE(names.reachable("peer"));  // before the handshake: bytes
  names.set_reachable("peer", true);
  CHECK(names.reachable("peer"));
  names.set_reachable("peer", false);  // a verdict turns it off again
  CHECK_FALSE(names.reachable("peer"));
  names.set_reachable("peer", true);
  names.drop_peer("peer");  // a lost peer is forgotten
  CHECK_FALSE(names.reachable("peer"));

  names.set_reachable("peer", true);
  names.disable_shared_memory();
  CHECK_FALSE(names.reachable("peer"));
  names.set_reachable("peer", true);
  CHECK_FALSE(names.reachable("peer"));
  CHECK(names.probe().pid == 0);  // nothing for a peer to open
}
