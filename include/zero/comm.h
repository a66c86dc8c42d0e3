/// @file
/// The distributed substrate: the world, process groups, and the one
/// collective dispatcher every call site goes through.
///
///   auto world = zero::init_distributed();           // rendezvous from the env
///   auto& comm = world->comm();
///   comm.all_gather(world->group(), full, shard)->wait();
///
/// Collectives are asynchronous: they return a Work handle whose wait()
/// completes the operation (and rethrows a failure as CommError naming the op
/// and the group). Every collective takes the group it runs on; the
/// data-parallel group may be a strict subset of the world.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/ATen.h>

#include "zero/comm_counters.h"
#include "zero/launch_env.h"

namespace zero::comm {

/// Any failure of a collective or of the process group: a timeout, a dead
/// peer, a refused call. One that says a peer went away (its connection
/// closed, its process exited) is noted for zero-run (note_peer_lost in
/// zero/launch_env.h): the peer's failure is what stopped the job, and the
/// launcher names that one.
class CommError : public std::runtime_error {
 public:
  explicit CommError(const std::string& what);  ///< notes a lost peer (above)
  explicit CommError(const char* what) : CommError(std::string(what)) {}  ///< (see above)
};

/// The ranks of a group issued different collectives (op, size, dtype or
/// label; see Signature): raised on every rank, naming both sides.
class CollectiveMismatch : public CommError {
 public:
  using CommError::CommError;
};

/// How a reduction combines the ranks' values: their sum, or their mean (the sum divided by the group's size).
enum class ReduceOp { Sum, Avg };

/// Completion handle of an asynchronous collective.
class Work {
 public:
  virtual ~Work() = default;
  /// Blocks until the collective is done and its outputs are written; throws
  /// CommError on failure or timeout. Calling it again is a no-op.
  virtual void wait() = 0;
  /// Whether the collective has completed, without blocking.
  virtual bool is_completed() = 0;
};
/// A collective in flight; `wait()` completes it.
using WorkHandle = std::shared_ptr<Work>;

/// A set of ranks that run collectives together. Ranks are global (world)
/// ranks; rank() is this process's index inside the group.
class Group {
 public:
  struct Impl;  ///< backend communicator; defined by the transports
  Group(std::string name, std::vector<int> global_ranks, int rank, std::shared_ptr<Impl> impl);

  const std::string& name() const { return name_; }  ///< its name, as given to new_group() or split() ("dp0")
  int size() const { return static_cast<int>(global_ranks_.size()); }  ///< how many ranks it has
  int rank() const { return rank_; }  ///< this process's index in the group
  const std::vector<int>& global_ranks() const { return global_ranks_; }  ///< its ranks' world ranks, in group order
  std::string describe() const;  ///< "dp0 (ranks 0,1)"
  /// Its world was shut down (World::shutdown()): every collective is refused.
  bool shut_down() const;
  /// The training step and micro-step the group's collectives belong to from
  /// now on; part of every collective's signature, so ranks whose loops fell
  /// out of step (one skipped a batch) fail at their first shifted collective,
  /// each naming its step, instead of pairing one step's grads with another's.
  /// The engine sets it; -1 (the default) leaves it out.
  /// `owner` (the engine setting it) owns the tag until another sets one.
  void set_step(int64_t step, int64_t micro, const void* owner = nullptr) const;
  /// Leaves the tag out again, if `owner` still owns it: an engine destroyed
  /// after another took the group over (at a time that may differ between
  /// ranks: a Python engine freed by the garbage collector) leaves the
  /// other's tag alone.
  void clear_step(const void* owner) const;
  /// "step 3.2", or "" when unset.
  std::string step_tag() const;
  Impl& impl() const { return *impl_; }  ///< the backend communicator (for the transports)

 private:
  std::string name_;
  std::vector<int> global_ranks_;
  int rank_;
  std::shared_ptr<Impl> impl_;
};

/// What every rank must agree on for one collective, as the dispatcher
/// describes it ("allgather of 4096 BFloat16 [params of unit 'h3']"): the
/// op, element count, dtype, root and the caller's label. Transports check
/// that all ranks of the group run the same signature before moving data.
struct Signature {
  std::string text;  ///< the signature as the ranks compare it, and as errors quote it
};

/// One way of moving bytes for a group: the backend (Gloo, NCCL) or a fast
/// path (e.g. shared memory between ranks on one host) that serves only what
/// supports() accepts. Every collective receives its Signature; a rank whose
/// signature differs from its peers' gets a CommError naming both, on every
/// rank, before any data moves.
class Transport {
 public:
  virtual ~Transport() = default;
  /// Its name in counters and logs ("shm", "hier", "gloo", "nccl", "cuda_ipc").
  virtual std::string name() const = 0;
  /// Whether it serves this collective (op, dtype, element count) for this group; the dispatcher asks before routing to it.
  virtual bool supports(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel) const = 0;
  /// An accelerator's fast paths are asked this instead, with the tensors'
  /// device (CUDA IPC decides per group from where its ranks' GPUs are).
  virtual bool supports_on(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel,
                           at::Device device) const {
    return supports(g, op, dtype, numel);
  }
  /// Bytes this rank sends for the op under this transport's algorithm.
  virtual int64_t wire_bytes(const Group& g, CollectiveOp op, at::ScalarType dtype,
                             int64_t numel) const = 0;

  /// out_flat = concat over group ranks of in_shard (out_flat.numel() == size * in_shard.numel()).
  virtual WorkHandle all_gather(const Group& g, at::Tensor out_flat, at::Tensor in_shard, const Signature& sig) = 0;
  /// out_shard = reduce over ranks of in_flat[rank * n, (rank + 1) * n). out_shard
  /// may be fp32 for a 16-bit input: the sum is accumulated in fp32 either way.
  virtual WorkHandle reduce_scatter(const Group& g, at::Tensor out_shard, at::Tensor in_flat, ReduceOp op,
                                    const Signature& sig) = 0;
  /// t = the reduction of every rank's t, on every rank, in place.
  virtual WorkHandle all_reduce(const Group& g, at::Tensor t, ReduceOp op, const Signature& sig) = 0;
  /// t = root's t on every rank (root is a rank inside the group).
  virtual WorkHandle broadcast(const Group& g, at::Tensor t, int root, const Signature& sig) = 0;
  /// Completes when every rank of the group has entered it.
  virtual WorkHandle barrier(const Group& g, const Signature& sig) = 0;
};

/// The dispatcher: validates arguments, counts every call, and routes it to
/// the first fast path that supports it, else the group's backend. `label`
/// says what the collective is for ("params of unit 'h3'"); it is part of the
/// signature the ranks must agree on and appears in errors.
class Comm {
 public:
  /// A dispatcher whose backend (Gloo) serves every collective no fast path takes.
  explicit Comm(std::shared_ptr<Transport> backend);

  /// Fast paths are asked in registration order (CPU tensors).
  void add_fast_path(std::shared_ptr<Transport> t);
  /// What serves tensors on an accelerator of `type` (CUDA: NCCL when built
  /// with CUDA, comm/nccl_transport.h), and the fast paths asked first (CUDA
  /// IPC between ranks sharing a GPU).
  void set_device_transport(c10::DeviceType type, std::shared_ptr<Transport> t);
  /// A fast path for tensors on an accelerator of `type`, asked before its transport (CUDA IPC).
  void add_device_fast_path(c10::DeviceType type, std::shared_ptr<Transport> t);
  /// A device whose memory the host addresses directly (the tests' CPU-backed
  /// device, tests/support/test_device.h): its tensors travel through the CPU
  /// transports as host views of the same memory, no copy.
  void serve_as_host_memory(c10::DeviceType type);
  /// Whether collectives on tensors of `type` have a transport here.
  bool serves(c10::DeviceType type) const;
  /// The transport a collective on `device` would go to, by name, or the
  /// reason none can serve it (for logs and tests).
  std::string route_name(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel, at::Device device);
  /// Off: every collective goes to the backend (ZERO_COMM_FASTPATH=off
  /// decides at setup; this switches routing later, e.g. from the ds_config).
  /// Every rank must switch at the same point in its sequence of collectives.
  void set_fast_paths_enabled(bool on) { fast_paths_enabled_ = on; }
  /// Whether fast paths are asked (set_fast_paths_enabled).
  bool fast_paths_enabled() const { return fast_paths_enabled_; }

  /// out_flat = every rank's in_shard laid end to end, in group order (Transport::all_gather). Asynchronous.
  WorkHandle all_gather(const Group& g, at::Tensor out_flat, at::Tensor in_shard, std::string_view label = {});
  /// out_shard = this rank's slice of the reduction of every rank's in_flat (Transport::reduce_scatter). Asynchronous.
  WorkHandle reduce_scatter(const Group& g, at::Tensor out_shard, at::Tensor in_flat, ReduceOp op = ReduceOp::Sum,
                            std::string_view label = {});
  /// t = the reduction of every rank's t, in place, on every rank. Asynchronous.
  WorkHandle all_reduce(const Group& g, at::Tensor t, ReduceOp op = ReduceOp::Sum, std::string_view label = {});
  /// root is a rank inside the group.
  WorkHandle broadcast(const Group& g, at::Tensor t, int root = 0, std::string_view label = {});
  /// Returns once every rank of the group has entered it (wait on the handle). Asynchronous.
  WorkHandle barrier(const Group& g);
  /// Broadcasts every tensor from `root` (blocking): one broadcast per dtype
  /// of the tensors laid end to end, not one per tensor (as DDP's
  /// _broadcast_coalesced). Tensors may be non-contiguous.
  void broadcast_coalesced(const Group& g, const std::vector<at::Tensor>& tensors, int root,
                           std::string_view label);

  /// The counts of every collective this dispatcher has run (zero/comm_counters.h).
  CommCounters& counters() { return counters_; }

 private:
  bool serves_as_host(c10::DeviceType type) const;
  /// A host-memory device's tensor as a CPU tensor over the same bytes; others as they are.
  at::Tensor host_view(const at::Tensor& t) const;
  Transport& route(const Group& g, CollectiveOp op, const at::Tensor& t);
  Transport& route(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel, at::Device device);
  WorkHandle count(const Group& g, CollectiveOp op, Transport& t, const at::Tensor& full, WorkHandle w);
  /// The payload as a dtype and a size (a widening all-gather counts what travels).
  WorkHandle count(const Group& g, CollectiveOp op, Transport& t, at::ScalarType dtype, int64_t numel, WorkHandle w);

  std::shared_ptr<Transport> backend_;
  std::vector<std::shared_ptr<Transport>> fast_paths_;
  struct DeviceTransports {
    std::shared_ptr<Transport> backend;
    std::vector<std::shared_ptr<Transport>> fast_paths;
  };
  std::vector<std::pair<c10::DeviceType, DeviceTransports>> devices_;
  std::vector<c10::DeviceType> host_memory_devices_;
  bool fast_paths_enabled_ = true;
  CommCounters counters_;
};

/// How init_distributed() starts the world: timeouts and this rank's device.
struct DistributedOptions {
  /// Defaults come from ZERO_RENDEZVOUS_TIMEOUT_S / ZERO_COLLECTIVE_TIMEOUT_S
  /// (seconds), else 300 s each.
  std::chrono::milliseconds rendezvous_timeout{0};
  std::chrono::milliseconds collective_timeout{0};  ///< bounds every collective: one a peer never joins fails naming op and group
  /// The device this rank computes on; default: the accelerator's (CUDA's)
  /// device LOCAL_RANK mod the devices visible, else the CPU. It is made the
  /// current device, as torchrun scripts call torch.cuda.set_device(local_rank).
  std::optional<at::Device> device;
  /// The rendezvous store at MASTER_ADDR:MASTER_PORT runs already (made by
  /// torch.distributed's init_process_group in the same job, as the Python
  /// front end does first): every rank joins it as a client and keeps its
  /// keys under their own prefix, instead of rank 0 serving it.
  bool join_existing_store = false;
};

/// This process's place in the job and its communicators: made by init_distributed(), which reads the launcher's environment (zero/launch_env.h) and meets the other ranks.
class World {
 public:
  struct Impl;
  /// Made by init_distributed(); not for direct use.
  explicit World(std::unique_ptr<Impl> impl);
  ~World();

  int rank() const;  ///< this process's rank in the world (RANK)
  int size() const;  ///< how many ranks the job has (WORLD_SIZE)
  const LaunchEnv& env() const;  ///< what the launcher said (rank, local rank, rendezvous, job id)
  /// Where this rank computes (DistributedOptions::device): a CUDA device
  /// when there is one, made current by init_distributed, else the CPU.
  at::Device device() const;
  /// All ranks of the world.
  const Group& group() const;
  Comm& comm();  ///< the dispatcher every collective of this world goes through

  /// Collective over the whole world: every rank calls it with the same
  /// arguments in the same order (as torch.distributed.new_group). Returns the
  /// group on its members and nullptr elsewhere.
  std::shared_ptr<Group> new_group(const std::vector<int>& ranks, const std::string& name);
  /// Partitions the world into groups of `group_size` consecutive ranks
  /// (world 4, size 2: {0,1}, {2,3}) and returns the one holding this rank.
  std::shared_ptr<Group> split(int group_size, const std::string& name_prefix);

  /// Destroys every group's communicators -- NCCL's, Gloo's, the shared-memory
  /// lanes, CUDA IPC buffers -- while the CUDA runtime is still up; a
  /// collective on any of its groups afterwards is a CommError. Call it at
  /// the end of training, on every rank (torch.distributed's
  /// destroy_process_group). Idempotent. A program that forgets it is covered:
  /// the destructor calls it, and so does an exit handler that
  /// init_distributed installs after the device is set (so it runs before
  /// CUDA's own teardown), for a World kept in a static or never freed.
  void shutdown();
  bool is_shut_down() const;  ///< whether shutdown() has run

 private:
  std::unique_ptr<Impl> impl_;
};

/// Rendezvous with the other ranks named by the launcher environment (see
/// LaunchEnv) and build the world group. Throws with a message naming the
/// variable, address or timeout at fault. Makes this process's stdout line
/// buffered (a rank's printf lines arrive as printed, not at exit, through
/// a launcher's pipe); ZERO_STDOUT_LINE_BUFFERED=0 leaves it as it is.
std::shared_ptr<World> init_distributed(const DistributedOptions& opts = {});

}  // namespace zero::comm

namespace zero {
using comm::init_distributed;
using comm::World;
}  // namespace zero
