#include "offload/shard_staging.h"

#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "offload/state_swapper.h"

namespace zero::offload {

ShardStaging::ShardStaging(StateSwapper& swapper, int64_t buffers)
    : swapper_(swapper), buffers_(static_cast<size_t>(std::max<int64_t>(buffers, 1))) {}

ShardStaging::~ShardStaging() {
  for (auto& b : buffers_)
    if (b.slot >= 0) discard_read(b);  // it must not still be writing into the buffer
}

bool ShardStaging::free(const Buffer& b) { return b.slot < 0 && (!b.uploading || b.uploading->query()); }

ShardStaging::Buffer* ShardStaging::find(int slot) {
  for (auto& b : buffers_)
    if (b.slot == slot) return &b;
  return nullptr;
}

ShardStaging::Buffer* ShardStaging::free_buffer(bool take_any) {
  for (auto& b : buffers_)
    if (free(b)) return &b;
  if (!take_any) return nullptr;
  for (auto& b : buffers_)
    if (b.slot < 0) {  // its copy up is still queued: wait for it
      b.uploading->synchronize();
      return &b;
    }
  Buffer& b = buffers_.front();  // every buffer holds another slot's read ahead
  discard_read(b);
  return &b;
}

void ShardStaging::reserve(int64_t bytes) { largest_ = std::max(largest_, bytes); }

at::Tensor ShardStaging::region(Buffer& b, int64_t bytes) {
  // Each buffer is made once, the size of the largest shard (reserve()), so
  // none is reallocated -- and left in the pinned allocator's cache -- as
  // larger shards come.
  const int64_t size = std::max(bytes, largest_) + io::kAlignment;
  if (!b.pinned.defined() || b.pinned.numel() < size)
    b.pinned = at::empty({size}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  b.uploading.reset();
  // Direct I/O needs an aligned start; the narrowed view keeps the pinned
  // storage, so the copy up is asynchronous and the allocator knows its use.
  const auto address = reinterpret_cast<uintptr_t>(b.pinned.data_ptr());
  const auto skip = static_cast<int64_t>((io::kAlignment - address % io::kAlignment) % io::kAlignment);
  return b.pinned.narrow(0, skip, bytes);
}

void ShardStaging::wait_read(Buffer& b) {
  const int slot = std::exchange(b.slot, -1);
  swapper_.wait_copy(slot, b.ticket);
}

void ShardStaging::discard_read(Buffer& b) noexcept {
  try {
    wait_read(b);
  } catch (...) {
    // A read thrown away: its failure is not this caller's (a read of the
    // slot itself, if it comes, fails on its own).
  }
}

bool ShardStaging::stage(int slot) {
  if (find(slot)) return false;
  Buffer* b = free_buffer(/*take_any=*/false);
  if (!b) return false;
  const at::Tensor into = region(*b, swapper_.copy_bytes(slot));
  const auto ticket = swapper_.read_copy(slot, into.data_ptr());
  if (!ticket) return false;
  b->slot = slot;
  b->ticket = *ticket;
  return true;
}

std::optional<at::Tensor> ShardStaging::upload(int slot, at::ScalarType dtype, int64_t numel, at::Device device) {
  Buffer* b = find(slot);
  at::Tensor staged;
  if (b) {
    staged = region(*b, swapper_.copy_bytes(slot));  // the buffer is already big enough: no reallocation
  } else {
    b = free_buffer(/*take_any=*/true);
    staged = region(*b, swapper_.copy_bytes(slot));
    const auto ticket = swapper_.read_copy(slot, staged.data_ptr());
    if (!ticket) return std::nullopt;
    b->slot = slot;
    b->ticket = *ticket;
  }
  wait_read(*b);  // throws naming the slot; the buffer is Free again either way
  const at::Tensor host = staged.narrow(0, 0, numel * static_cast<int64_t>(c10::elementSize(dtype))).view(dtype);
  at::Tensor up = at::empty({numel}, at::TensorOptions().dtype(dtype).device(device));
  up.copy_(host, /*non_blocking=*/true);
  const c10::impl::VirtualGuardImpl streams(device.type());
  b->uploading.emplace(device.type());
  b->uploading->record(streams.getStream(device));
  return up;
}

void ShardStaging::drop(int slot) {
  if (Buffer* b = find(slot)) discard_read(*b);
}

int64_t ShardStaging::busy() const {
  return std::count_if(buffers_.begin(), buffers_.end(), [](const Buffer& b) { return !free(b); });
}

}  // namespace zero::offload
