#pragma once
/// \file host_address.hpp
/// Addresses of this host as others see it. One is the local address that routes to a peer.
/// The other is the address a node publishes for a bind address (Note [listen and advertise]).
///
/// Note [listen and advertise]
/// A node binds `listen_addr` and publishes one address in the store for its peers. A concrete
/// bind address is published as is. The wildcard 0.0.0.0 (or an empty address) is never
/// published. Instead the node publishes the local address that routes to the master: the
/// address its peers reach it on. A single-host job keeps loopback everywhere.
///
///   listen_addr     published
///   127.0.0.1       127.0.0.1
///   10.1.2.3        10.1.2.3
///   0.0.0.0         routable_address(master_addr)   e.g. 10.1.2.3

#include <string>

namespace troupe {

/// The local IPv4 address the kernel picks to reach `host` (an IPv4 address or a host name).
/// No packet is sent (a UDP socket is connected, then asked for its local address). Blocks only
/// for a name lookup. Throws bad_argument when `host` does not resolve, io_error when no route
/// leads to it.
std::string routable_address(const std::string& host);

/// True for 127.0.0.0/8 addresses and "localhost".
bool is_loopback_address(const std::string& host);

/// True for "0.0.0.0" and the empty address (bind every interface).
bool is_wildcard_address(const std::string& host);

/// The address a node bound to `listen_addr` publishes (Note [listen and advertise]): itself,
/// or for the wildcard the address routing to `master_addr`. Throws as routable_address.
std::string advertised_address(const std::string& listen_addr, const std::string& master_addr);

/// The address and port of a connected IPv4 socket's peer ("10.1.2.3:4567"), for messages;
/// "an unknown address" when the socket has none.
std::string peer_address(int fd);

/// The first host of a Slurm node list ("gpu[03-05,9],cpu1" -> "gpu03"). bad_argument when the
/// list is empty or its brackets do not close.
std::string first_slurm_host(const std::string& nodelist);

}  // namespace troupe
