#include "memory/storage_release.h"

#include <cstdint>
#include <optional>
#include <stdexcept>

#include <c10/core/DeviceGuard.h>

#include "common/guard_device.h"

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
  const c10::OptionalDeviceGuard on_its_device(guard_device(flat));
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

bool storage_released(const at::Tensor& flat) { return flat.numel() > 0 && flat.storage().nbytes() == 0; }

at::Tensor released_flat(int64_t numel, at::ScalarType dtype, c10::Device device,
                         const std::function<void(const at::Tensor&)>& cut_views) {
  const size_t bytes = static_cast<size_t>(numel) * c10::elementSize(dtype);
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, c10::GetAllocator(device.type()), /*resizable=*/true);
  // No memory behind it (the data pointer names the device, not the
  // current one), but the extent declared, so views can be cut.
  storage.unsafeGetStorageImpl()->set_data_ptr_noswap(c10::DataPtr(nullptr, device));
  storage.unsafeGetStorageImpl()->set_nbytes(bytes);
  at::Tensor flat = at::empty({0}, at::TensorOptions().dtype(dtype).device(device));
  flat.set_(storage, 0, {numel}, {1});
  cut_views(flat);
  release_storage(flat);  // the extent goes; nothing was held
  return flat;
}

}  // namespace zero::memory
