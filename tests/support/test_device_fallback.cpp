// The boxed fallback: every op without a zdev kernel runs its CPU kernel in
// place on the device memory, after the argument checks a CUDA kernel makes.
//
//   1. Where it runs: all tensor arguments on one zdev device (a CPU tensor
//      only as a 0-dim scalar input, or as an index of an indexing op, as
//      CUDA allows), each with its memory on its own device.
//   2. Each device tensor is replaced by a CPU tensor over the same memory
//      (HostAliases), device arguments by the CPU; the CPU kernel runs under
//      a device guard for the op's device.
//   3. What the kernel did to written arguments is carried back (a resized
//      out= tensor moves back to device memory); each result that lives in
//      an argument's memory (in-place, out=, views) is returned over that
//      argument's device storage, any other result is copied into memory
//      taken on the op's device.
#include <cstring>
#include <optional>
#include <string>
#include <unordered_set>

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/strides.h>

#include "test_device_allocator.h"
#include "test_device_guard.h"
#include "test_device_ops.h"

namespace zero::test_device::detail {

namespace {

// Ops whose CUDA kernels copy device data to the host and wait for it: a
// result size that depends on the data, or a bool the host returns. (Indexing
// with a boolean mask is one too: see masked_index below.)
bool host_waits_for_data(const c10::OperatorName& name) {
  static const std::unordered_set<std::string> ops = {
      "aten::nonzero",
      "aten::masked_select",
      "aten::_unique",
      "aten::_unique2",
      "aten::unique_dim",
      "aten::unique_consecutive",
      "aten::unique_dim_consecutive",
      "aten::repeat_interleave",
      "aten::equal",
      "aten::bincount",
  };
  return ops.count(name.name) > 0;
}

std::string op_label(const c10::FunctionSchema& schema) {
  const auto& name = schema.operator_name();
  return name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
}

bool writes(const c10::Argument& argument) {
  return argument.alias_info() != nullptr && argument.alias_info()->isWrite();
}

// CUDA's indexing kernels move CPU index tensors to the device themselves.
bool is_index_list(const c10::Argument& argument, const c10::IValue& value) {
  return argument.name() == "indices" && value.isList() && !value.isTensorList();
}

// A boolean (or byte) mask among an indexing op's indices: CUDA turns it
// into indices with nonzero, whose size the host reads.
bool masked_index(const c10::Argument& argument, const c10::IValue& value) {
  if (!is_index_list(argument, value)) return false;
  for (const c10::IValue& index : value.toListRef()) {
    if (index.isTensor() &&
        (index.toTensor().scalar_type() == at::kBool || index.toTensor().scalar_type() == at::kByte))
      return true;
  }
  return false;
}

template <typename F>
void for_each_tensor(const c10::IValue& value, F&& f) {
  if (value.isTensor()) {
    f(value.toTensor());
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (element.isTensor()) f(element.toTensor());
    }
  }
}

// Step 1: the device the op runs on, after CUDA's checks of its arguments.
class DeviceCheck {
 public:
  explicit DeviceCheck(std::string op) : op_(std::move(op)) {}

  void tensor(const at::Tensor& t, const c10::Argument& argument, bool may_be_on_host) {
    if (!t.defined()) return;
    if (on_test_device(t)) {
      check_memory(t, op_, argument.name());
      if (!device_) {
        device_ = t.device();
      } else if (t.device() != *device_) {
        mismatch(*device_, t.device(), argument.name());
      }
      return;
    }
    if (t.is_cpu() && (may_be_on_host || (t.dim() == 0 && !writes(argument)))) return;
    if (!stray_) stray_ = std::make_pair(t.device(), argument.name());
  }

  void device_argument(const c10::Device& d) {
    if (d.is_privateuseone() && !requested_) requested_ = c10::Device(d.type(), resolve(d.index()));
  }

  c10::Device device() const {
    c10::Device d(c10::kPrivateUse1, current_device());  // a factory's, as on CUDA
    if (device_) {
      d = *device_;
    } else if (requested_) {
      d = *requested_;
    }
    if (stray_) mismatch(d, stray_->first, stray_->second);
    return d;
  }

 private:
  void mismatch(const c10::Device& a, const c10::Device& b, const std::string& arg) const {
    TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", a, " and ", b,
                "! (when checking argument '", arg, "' of ", op_, ")");
  }

  std::string op_;
  std::optional<c10::Device> device_, requested_;
  std::optional<std::pair<c10::Device, std::string>> stray_;
};

// Step 3, written arguments: a kernel that grew an out= tensor gave its host
// storage a new host block; the device storage takes a device block with
// those bytes. A kernel that changed a tensor's sizes or strides (resize,
// as_strided_) changed the host tensor's; the device tensor takes them.
void carry_back_storage(const HostAliases::Entry& entry, c10::Device device) {
  c10::StorageImpl* host = entry.host.unsafeGetStorageImpl();
  c10::StorageImpl* dev = entry.device.unsafeGetStorageImpl();
  if (host->data() == dev->data() && host->nbytes() == dev->nbytes()) return;
  const c10::DeviceGuard guard(device);
  c10::DataPtr block = device_memory().allocate(host->nbytes());
  if (host->nbytes() != 0) std::memcpy(block.get(), host->data(), host->nbytes());
  dev->set_data_ptr_noswap(std::move(block));
  dev->set_nbytes(host->nbytes());
}

void carry_back_tensor(const at::Tensor& device_tensor, const at::Tensor& host_tensor, const HostAliases& aliases) {
  c10::TensorImpl* dev = device_tensor.unsafeGetTensorImpl();
  if (host_tensor.storage().unsafeGetStorageImpl() != nullptr) {
    const HostAliases::Entry* entry = aliases.by_host(host_tensor.storage().unsafeGetStorageImpl());
    TORCH_CHECK(entry != nullptr, "zdev: the kernel gave a written argument a storage of its own; not supported");
    if (entry->device.unsafeGetStorageImpl() != dev->storage().unsafeGetStorageImpl())
      dev->set_storage_keep_dtype(entry->device);
  }
  if (!dev->sizes().equals(host_tensor.sizes()) || !dev->strides().equals(host_tensor.strides()) ||
      dev->storage_offset() != host_tensor.storage_offset()) {
    dev->set_sizes_and_strides(host_tensor.sizes(), host_tensor.strides(), host_tensor.storage_offset());
  }
}

// Step 3, results.
class ResultMapper {
 public:
  ResultMapper(const HostAliases& aliases, c10::Device device) : aliases_(aliases), device_(device) {}

  void argument(const at::Tensor& device_tensor, const at::Tensor& host_tensor) {
    by_host_impl_.emplace(host_tensor.unsafeGetTensorImpl(), device_tensor);
  }

  at::Tensor map(const at::Tensor& r) const {
    if (!r.defined() || !r.is_cpu()) return r;
    // The argument itself (in-place and out= ops return it).
    auto same = by_host_impl_.find(r.unsafeGetTensorImpl());
    if (same != by_host_impl_.end()) return same->second;
    // A view of an argument's memory.
    if (const HostAliases::Entry* entry = aliases_.by_host(r.storage().unsafeGetStorageImpl())) {
      at::Tensor v = at::detail::make_tensor<c10::TensorImpl>(
          c10::Storage(entry->device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), r.dtype());
      v.unsafeGetTensorImpl()->set_sizes_and_strides(r.sizes(), r.strides(), r.storage_offset());
      if (r.is_conj()) v._set_conj(true);
      if (r.is_neg()) v._set_neg(true);
      return v;
    }
    return copy_to_device(r);
  }

  c10::IValue map(const c10::IValue& value) const {
    if (value.isTensor()) return map(value.toTensor());
    if (!value.isList()) return value;
    c10::impl::GenericList list = value.toList().copy();
    for (size_t i = 0; i < list.size(); ++i) {
      const c10::IValue element = list.get(i);
      if (element.isTensor()) list.set(i, map(element.toTensor()));
    }
    return c10::IValue(std::move(list));
  }

 private:
  // A new result: into memory taken on the op's device (not the current one).
  at::Tensor copy_to_device(const at::Tensor& r) const {
    const bool dense = r.is_non_overlapping_and_dense();
    const at::Tensor out =
        empty_on(device_, r.sizes(), dense ? r.strides() : c10::contiguous_strides(r.sizes()), r.dtype());
    if (dense) {
      if (r.numel() != 0) std::memcpy(out.data_ptr(), r.const_data_ptr(), r.numel() * r.itemsize());
    } else {
      HostAliases host;
      host.of(out).copy_(r);
    }
    if (r.is_conj()) out._set_conj(true);
    if (r.is_neg()) out._set_neg(true);
    return out;
  }

  const HostAliases& aliases_;
  c10::Device device_;
  std::unordered_map<const c10::TensorImpl*, at::Tensor> by_host_impl_;
};

}  // namespace

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const std::vector<c10::Argument>& arguments = schema.arguments();
  const size_t first = stack->size() - arguments.size();

  DeviceCheck check(op_label(schema));
  bool host_waits = host_waits_for_data(schema.operator_name());
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& value = (*stack)[first + i];
    const bool index_list = is_index_list(arguments[i], value);
    host_waits = host_waits || masked_index(arguments[i], value);
    for_each_tensor(value, [&](const at::Tensor& t) { check.tensor(t, arguments[i], index_list); });
    if (value.isDevice()) check.device_argument(value.toDevice());
  }
  const c10::Device device = check.device();

  HostAliases aliases;
  ResultMapper results(aliases, device);
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // (device, host)
  auto to_host = [&](const at::Tensor& t, const c10::Argument& argument) {
    at::Tensor h = aliases.of(t);
    results.argument(t, h);
    if (writes(argument)) written.emplace_back(t, h);
    return h;
  };
  for (size_t i = 0; i < arguments.size(); ++i) {
    c10::IValue& value = (*stack)[first + i];
    if (value.isTensor()) {
      if (on_test_device(value.toTensor())) value = to_host(value.toTensor(), arguments[i]);
    } else if (value.isList()) {
      c10::impl::GenericList list = value.toList().copy();
      bool changed = false;
      for (size_t j = 0; j < list.size(); ++j) {
        const c10::IValue element = list.get(j);
        if (element.isTensor() && on_test_device(element.toTensor())) {
          list.set(j, to_host(element.toTensor(), arguments[i]));
          changed = true;
        }
      }
      if (changed) value = c10::IValue(std::move(list));
    } else if (value.isDevice() && value.toDevice().is_privateuseone()) {
      value = c10::IValue(c10::Device(c10::kCPU));
    }
  }

  if (host_waits) count_transfer(Transfer::DeviceToHost, true);
  {
    const c10::DeviceGuard guard(device);
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }

  for (const HostAliases::Entry& entry : aliases.entries()) carry_back_storage(entry, device);
  for (const auto& [device_tensor, host_tensor] : written) carry_back_tensor(device_tensor, host_tensor, aliases);

  const size_t returns = schema.returns().size();
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) (*stack)[i] = results.map((*stack)[i]);
}

}  // namespace zero::test_device::detail
