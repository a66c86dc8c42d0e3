#include "memory/storage_release.h"

#include <stdexcept>

namespace zero::memory {

namespace {
size_t extent_bytes(const at::Tensor& flat) {
  if (flat.storage_offset() != 0)
    throw std::logic_error("zero-cpp: a released flat buffer must start its storage");
  return static_cast<size_t>(flat.numel()) * flat.element_size();
}
}  // namespace

void release_storage(const at::Tensor& flat) {
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  if (s->nbytes() == 0) return;
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, flat.device()));  // the old block goes back to its allocator
  s->set_nbytes(0);
}

void restore_storage(const at::Tensor& flat) {
  c10::StorageImpl* s = flat.storage().unsafeGetStorageImpl();
  if (s->nbytes() != 0) return;
  const size_t bytes = extent_bytes(flat);
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
  flat.zero_();  // as the host path: padding is zero, and nothing stale is read
}

bool storage_released(const at::Tensor& flat) { return flat.numel() > 0 && flat.storage().nbytes() == 0; }

}  // namespace zero::memory
