// ZeRO-Infinity's swapper: state that lives in a swap file on a local disk
// and in memory only while it is used. Three of them serve NVMe offload:
// offload_optimizer's (each flat group's fp32 master and optimizer state,
// in memory during the step, a checkpoint, a gathered-params write-back),
// the grads' (offload/grad_swap.h: each group's reduced fp32 grad shard,
// in memory while a reduction writes it or the step reads it) and
// offload_param's (stage 3's param shards, in memory while a gather reads
// them, the step writes them or a checkpoint uses them).
//
// The tensors keep their address throughout: they are page-backed buffers
// (memory/page_buffer.h) whose pages are released to the OS once written
// out, and restored then read back in place. A stray access while they are
// on disk stops the process naming the group (memory/release_guard.h)
// instead of reading zeros.
//
// Each group's state is a slot, in one of five states (the only transitions
// are in state_swapper.cpp's `Slot` functions):
//
//   OnDisk --prefetch--> Reading --acquire--> Resident --release(dirty)--> Writing
//     ^                                          |                           |
//     +------------- release(clean) -------------+<------ retire ------------+
//
//   Empty --acquire--> Resident (zeros; no read)      any but Resident --discard--> Empty
//
// Empty means nothing on disk is worth reading: the slot's contents are
// zeros (a reduced-grad shard between steps, or adopted without a write).
// A clean release of a slot that was Empty returns it to Empty.
// acquire(slot, Contents::Overwrite) is for a user that will write all of
// the slot before reading it (a reduction into a grad shard): no read.
//
// Acquires nest: a slot leaves Resident when its last user releases it,
// written back if any of them changed it (a param shard a gather reads
// while a checkpoint scope holds it, say).
//
// The optimizer step pipelines them as DeepSpeed's PipelinedOptimizerSwapper
// does: while group k is updated, k+1 is read (pipeline_read) and k-1
// written (pipeline_write).
//
// The swap file is scratch: created under nvme_path, unlinked at once (so
// no exit, however abrupt, leaves it behind or lets anything read it), its
// space reserved with fallocate as each group arrives (a full disk is an
// error at engine construction, not mid-step).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "io/aio_engine.h"

namespace zero {
struct AioSettings;
struct OffloadConfig;
}

namespace zero::offload {

// The ds_config "aio" block as the I/O engine's settings.
io::AioConfig aio_config(const AioSettings& aio);

struct SwapperOptions {
  std::string nvme_path;       // the directory for the swap file
  // The ds_config block that asked for it ("zero_optimization.offload_optimizer"),
  // and what its slots hold ("optimizer state"): both name it in messages.
  std::string config_key = "zero_optimization.offload_optimizer";
  std::string what = "optimizer state";
  // Names the swap file beside the config key's kind (two swappers of one
  // key in one process -- the optimizer's state and its grads -- differ).
  std::string file_tag;
  bool pipeline_read = false;  // read the next group during this one's update
  bool pipeline_write = false; // write this group during the next one's update
  io::AioConfig aio;
  int rank = 0;                // names the file and the messages
};

// A swapper's options from an offload block (nvme_path, the pipelines) and
// the "aio" block, for `rank`.
SwapperOptions swapper_options(const OffloadConfig& offload, const AioSettings& aio, int rank);

class StateSwapper {
 public:
  // Opens the swap file; throws std::runtime_error naming nvme_path and
  // what is wrong with it (missing, not a directory, not writable, no
  // direct I/O).
  explicit StateSwapper(SwapperOptions options);
  StateSwapper(const StateSwapper&) = delete;
  StateSwapper& operator=(const StateSwapper&) = delete;
  ~StateSwapper();  // waits for I/O in flight; the file goes with its descriptor

  // Takes one group's state to disk: `tensors` are contiguous CPU buffers,
  // page-backed (memory::zeros_flat, flat_copy_of) and starting at their
  // storage's start; written, then their pages released. Returns the
  // group's slot. `label` names the group in messages.
  int adopt(std::vector<at::Tensor> tensors, const std::string& label);
  // The same for state that is all zeros now: its space is reserved and its
  // pages released, nothing written; the slot starts Empty.
  int adopt_empty(std::vector<at::Tensor> tensors, const std::string& label);

  // Starts reading a slot's state back (nothing if it is in memory or on its way).
  void prefetch(int slot);
  // The slot's state in memory, for reading and writing, until release().
  // Acquires nest (each needs its release). Overwrite: the user writes all
  // of it before reading any, so a slot on disk is not read (its pages come
  // back as zeros; a prefetch under way is waited for).
  enum class Contents { Read, Overwrite };
  void acquire(int slot, Contents contents = Contents::Read);
  // One user is done with the slot. When the last one is, it is written
  // back if any user changed it (`dirty`) -- in the background with
  // pipeline_write; the previous background write is finished first --
  // and its pages are then released.
  void release(int slot, bool dirty);
  // Finishes every background write and releases those pages.
  void flush();
  // The slot's contents become zeros without any I/O (its disk copy is
  // forgotten). Not while it is acquired.
  void discard(int slot);

  // A copy of a slot's state elsewhere, the slot staying where it is: for a
  // one-tensor slot whose current contents are its disk copy (OnDisk),
  // queues a read of them into `buffer` (the caller's: kAlignment-aligned,
  // at least copy_bytes(slot)) and returns its ticket, waited for with
  // wait_copy(). Anywhere else (in memory, on its way in or out, Empty) it
  // reads nothing and returns nullopt: the caller acquires the slot. The
  // caller must not acquire the slot while its copy is in flight (a release
  // could rewrite the bytes being read).
  std::optional<io::AioEngine::Ticket> read_copy(int slot, void* buffer);
  void wait_copy(int slot, io::AioEngine::Ticket ticket);  // throws naming the slot
  int64_t copy_bytes(int slot);  // the bytes read_copy writes into `buffer`

  const SwapperOptions& options() const { return options_; }
  int64_t file_bytes() const { return file_bytes_; }  // reserved on disk
  int resident_slots() const;                          // in memory now (any state but OnDisk and Empty)

 private:
  enum class State { Empty, OnDisk, Reading, Resident, Writing };
  struct Slot {
    std::vector<at::Tensor> tensors;
    std::vector<int64_t> offsets;  // of each tensor in the file
    std::vector<io::AioEngine::Ticket> in_flight;
    std::string label;
    State state = State::Resident;
    int users = 0;       // acquires not yet released (Resident only)
    bool dirty = false;  // a user changed it since it was last written
    bool disk_copy = false;  // the file holds its contents (else releasing it makes it Empty)
  };
  Slot& slot(int index);
  void start_transfer(Slot& s, bool write);
  void finish_transfer(Slot& s, const char* what);
  // Waits for a Writing slot's write; on failure the slot stays in memory, dirty.
  void finish_write(Slot& s);
  void release_pages(Slot& s);
  void abandon_transfer(Slot& s) noexcept;  // waits for any piece in flight, errors dropped
  void retire_writes();  // every Writing slot -> OnDisk
  int add_slot(std::vector<at::Tensor> tensors, const std::string& label);  // reserves its space; Resident
  std::string where(const Slot& s) const;

  SwapperOptions options_;
  std::string path_;
  std::unique_ptr<io::DirectFile> file_;
  std::unique_ptr<io::AioEngine> engine_;
  std::vector<Slot> slots_;
  int64_t file_bytes_ = 0;
};

}  // namespace zero::offload
