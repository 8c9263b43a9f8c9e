#pragma once
/// \file node_options.hpp
/// Options of a node, from code, with the launcher conventions as defaults.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "troupe/actors/tls_options.hpp"

namespace caf {
class actor_system_config;
}

namespace troupe {

/// How a node starts. `from_env()` fills the launcher conventions (RANK, WORLD_SIZE, LOCAL_RANK,
/// MASTER_ADDR, MASTER_PORT, TROUPE_JOB_TOKEN, TROUPE_LISTEN_ADDR, TROUPE_TRACE, TROUPE_TLS_CERT/KEY/CA,
/// or Slurm's); every field can
/// then be overridden in code.
struct node_options {
  /// Worker name; empty means "worker<rank>".
  std::string name;
  std::int32_t rank = 0;
  std::int32_t world_size = 1;
  std::int32_t local_rank = 0;
  /// Address of rank 0 (the store host) and its port. Rank 0 listens on master_port (0 = ephemeral,
  /// read it back with node::port()).
  std::string master_addr = "127.0.0.1";
  std::uint16_t master_port = 0;
  /// Address this node listens on (loopback unless told otherwise). Non-zero ranks listen on an
  /// ephemeral port. "0.0.0.0" listens on every interface and publishes the address that routes
  /// to master_addr (Note [listen and advertise] in host_address.hpp).
  std::string listen_addr = "127.0.0.1";
  /// The shared secret every connection must present (hello) before it can call anything.
  /// An empty token is refused off loopback, and on loopback unless allow_empty_token is set.
  std::string job_token;
  /// Mutual TLS (Note [tls] in tls_context.hpp): certificate, key and CA files; empty is off.
  /// Process groups formed through env_process_group use it on their TCP ring.
  tls_options tls;
  /// Accept an empty job_token on a loopback listen_addr: any local process can then join.
  bool allow_empty_token = false;
  /// A connection that has not authenticated by then is closed (the direct channel and the
  /// CAF port's gate, Note [connection hygiene]).
  std::chrono::milliseconds auth_deadline{2000};
  /// At most this many connections wait to authenticate per listener (0 counts as 1); a new
  /// one beyond it closes the oldest waiting one.
  std::size_t max_unauthenticated = 64;
  /// Large tensors (1 MiB or more) to a peer on the same host travel through shared memory.
  /// This needs the peer to open this process's memory (Note [shm reachability]), checked at
  /// the first contact. false sends every tensor as bytes on the connection, both ways.
  bool shared_memory_rpc = true;
  /// Device maps of RPC per peer worker name: local CUDA index -> the peer's CUDA index
  /// (Note [rpc device map] in troupe/actors/rpc/device_map.hpp). The node checks them when it
  /// starts. It checks the indices at once, and the worker names once every rank joined (bounded
  /// by join_timeout). Errors are bad_argument naming the entry or the worker.
  std::map<std::string, std::map<int, int>> device_maps;
  /// The largest message a peer may send on the direct channel, in bytes. A message is an rpc
  /// request or response, or a remote actor message: payload, names and metadata. Every length a
  /// peer announces (a frame, a fragmented message's total) is checked against it before
  /// anything is allocated. A larger one is a protocol violation and the connection is dropped.
  /// A larger message of this node fails at its sender: bad_argument for a call's arguments and
  /// an actor request, remote_exception for a result. Between 1 MiB and 1 GiB (the frame limit);
  /// other values act as the nearer bound.
  std::uint64_t max_message_bytes = std::uint64_t{1} << 30;
  /// Threads running user RPC functions (never CAF scheduler threads). Bounds nesting depth.
  int executor_threads = 4;
  /// Default deadline of an RPC and of store operations.
  std::chrono::milliseconds default_timeout{30000};
  /// Timeout of joining the store at start-up (connect + hello + register).
  std::chrono::milliseconds join_timeout{10000};
  /// Middleman heartbeat and connection timeout: a frozen peer is dropped after connection_timeout.
  /// 500 ms drops live in-process peers on a 2-core machine at load 5-6: a starved multiplexer
  /// misses heartbeats. A dead process is seen at once through EOF, not through this.
  std::chrono::milliseconds heartbeat_interval{100};
  std::chrono::milliseconds connection_timeout{1000};
  /// CAF scheduler: "sharing" policy with few threads is best on small machines (CAF-0.17-NOTES).
  std::string scheduler_policy = "sharing";
  std::size_t scheduler_threads = 2;
  std::size_t middleman_workers = 0;
  /// Operations the node's flight recorder keeps (Note [flight recorder]): the last collectives,
  /// RPCs and backward passes of this rank.
  std::size_t recorder_capacity = 1024;
  /// Hang blame for RPCs (Note [rpc blame]). A call of this node that waits this long gets one
  /// report. It names the caller, the callee, the function and the wait, and says what the
  /// callee's recorder says: running it, or not and why. A call that then times out carries the
  /// report in its error. The same knob as process_group_options::blame_after. 0: off (no watch
  /// thread).
  std::chrono::milliseconds blame_after{5000};
  /// Receives each RPC hang report, on a watch or I/O thread; it must not block long. Null
  /// prints it on stderr as a line `troupe-blame: ...`.
  std::function<void(const std::string&)> on_blame;
  /// A directory: the node writes its recorder's Chrome trace there as trace-rank<rank>.json at
  /// shutdown, and process groups write it when a collective fails. Empty: no trace file.
  std::string trace_dir;
  /// Extra CAF settings (name -> value as text) applied last, for measured overrides.
  std::map<std::string, std::string> caf_overrides;
  /// Run on the actor system's config before it starts, in order: announces the message types
  /// of user actors (troupe::add_actor_message_type in troupe/actors/remote_actor.hpp).
  std::vector<std::function<void(caf::actor_system_config&)>> actor_setup;

  /// Options from the launcher environment variables; missing ones keep the defaults above.
  /// TROUPE_TRACE sets trace_dir. TROUPE_LISTEN_ADDR sets listen_addr. Without it, a node whose
  /// master is not on loopback listens on the local address that routes to the master.
  /// Without RANK, Slurm's variables give the job: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID.
  /// The first host of SLURM_JOB_NODELIST is the master (MASTER_ADDR wins when set). The port is
  /// MASTER_PORT, or else 29500 + SLURM_JOB_ID % 1000.
  /// Throws errc::bad_argument when a variable holds an unparsable number or node list, and
  /// io_error when no route leads to a remote master.
  static node_options from_env();
  /// A fresh random job token (128 bits from std::random_device, as hex), for a job's processes
  /// to share. Throws errc::io_error when no entropy source is available.
  static std::string random_token();
  /// The effective worker name.
  std::string worker_name() const { return name.empty() ? "worker" + std::to_string(rank) : name; }
};

}  // namespace troupe
