#pragma once
/// \file checkpointer.hpp
/// Job-wide training checkpoints: every K steps each rank saves its part. The job's step counts
/// as saved only once every part is durable and rank 0 wrote the manifest. On start the
/// job loads the last complete checkpoint, so a restarted job resumes where it left off.
///
/// Note [Job checkpoint]
/// ---------------------
/// Layout under the directory (shared by every rank of the job):
///
///   step-00000040/rank-0.part   a checkpoint file (Note [Checkpoint file]) of rank 0's state
///   step-00000040/rank-1.part   ... one per rank
///   step-00000040/MANIFEST      text: "troupe-job-checkpoint 1", "step S", "world W", then
///                               "part R BYTES CHECKSUM" per rank; written last
///
/// Save at step S (every rank, in step):
///
///   rank r: encode state -> write rank-r.part.tmp, fsync, rename   (atomic_write_file)
///   all:    allgather (bytes, payload checksum) of every part      (the process group)
///   rank 0: write MANIFEST atomically; drop complete steps beyond `keep`
///
/// A part holds every tracked module, optimizer, generator and counter under its name, and the
/// step. A checkpoint is complete only when its MANIFEST is there and every part it names has
/// the listed size and checksum. A rank that dies before the allgather leaves no manifest; the
/// others fail in the allgather (peer_lost or timeout), and the launcher restarts the job.
///
/// Restore (every rank, once, before training): rank 0 walks the step directories from the
/// newest. It skips each incomplete one with a message on stderr: the manifest missing or torn,
/// a part missing, short, with another checksum or failing to decode, or another world size. It
/// broadcasts the step it picked, or -1. Every rank then loads its own part of that step. The
/// model and optimizer are loaded in place, so a DistributedDataParallel built before restore()
/// keeps working.
///
/// Reads are bounded. The manifest is read only up to 64 KiB, a part only up to the size the
/// manifest lists. Parts decode through decode_checkpoint, which checks lengths before it
/// allocates.
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "troupe/autograd/nn/module.hpp"
#include "troupe/autograd/optim/optimizer.hpp"
#include "troupe/ddp/process_group.hpp"
#include "troupe/tensors/generator.hpp"

namespace troupe::ddp {

/// How often and where a checkpointer saves.
struct checkpointer_options {
  std::filesystem::path dir;   ///< shared by every rank; created when missing
  std::int64_t every = 100;    ///< save after each step that is a multiple of this (>= 1)
  int keep = 2;                ///< complete checkpoints kept (>= 1); older ones are removed
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};  ///< bound of each collective
  /// Runs on this rank after its part is durable and before the job commits the step. Tests use
  /// it to stop a rank in the middle of a checkpoint; leave empty otherwise.
  std::function<void(std::int64_t step)> after_part_written;
};

/// Saves and restores the tracked training state of one rank as part of a job checkpoint
/// (Note [Job checkpoint]). Every rank of the process group makes one with the same options and
/// tracks the same names in the same order. Not thread-safe; call from the training thread.
class checkpointer {
 public:
  /// Throws bad_argument for an empty dir, every < 1 or keep < 1.
  checkpointer(process_group& group, checkpointer_options opts);

  /// Tracks a module's state_dict (parameters and buffers) under `name`.
  void track(const std::string& name, nn::module& m);
  /// Tracks an optimizer's state_dict under `name`.
  void track(const std::string& name, optim::optimizer& opt);
  /// Tracks a generator's seed and offset under `name`.
  void track(const std::string& name, generator& gen);
  /// Tracks an integer (a data position, an epoch) under `name`.
  void track(const std::string& name, std::int64_t& value);

  /// Loads the last complete checkpoint into the tracked state and returns its step, or 0 when
  /// there is none. Collective; blocks up to the timeout per collective. Errors: the process
  /// group's (peer_lost, timeout), checkpoint_corrupt or io_error when this rank's part of the
  /// chosen step cannot be read, load_state_dict's when it does not fit.
  std::int64_t restore();

  /// Saves when `step` is a multiple of `every`; returns whether it saved. Collective.
  bool maybe_save(std::int64_t step);
  /// Saves the tracked state as `step` (Note [Job checkpoint]). Collective; blocks until the
  /// part is durable and, on rank 0, the manifest too. Errors: io_error naming the file, the
  /// process group's errors.
  void save(std::int64_t step);

  /// The bytes of this rank's part at the last save or restore (0 before either).
  std::uint64_t part_bytes() const noexcept { return part_bytes_; }
  /// The directory of `step`'s checkpoint.
  std::filesystem::path step_dir(std::int64_t step) const;

 private:
  state_dict collect() const;
  void apply(const state_dict& all);
  std::int64_t pick_complete_step() const;
  void write_manifest(std::int64_t step, const std::vector<std::int64_t>& info) const;
  void prune(std::int64_t newest) const;

  process_group& group_;
  checkpointer_options opts_;
  std::vector<std::pair<std::string, nn::module*>> modules_;
  std::vector<std::pair<std::string, optim::optimizer*>> optimizers_;
  std::vector<std::pair<std::string, generator*>> generators_;
  std::vector<std::pair<std::string, std::int64_t*>> counters_;
  std::uint64_t part_bytes_ = 0;
};

}  // namespace troupe::ddp
