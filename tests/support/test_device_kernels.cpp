// The test device's own kernels: the ones no CPU kernel can stand in for
// (factories, views, storage surgery, copies across devices), and the
// registration that sends everything else to the boxed fallback.
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_set>

#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/is_set_to_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "test_device_allocator.h"
#include "test_device_ops.h"

namespace zero::test_device::detail {

constexpr c10::DispatchKeySet kDeviceKeys(c10::DispatchKey::PrivateUse1);

// ---- shared helpers ----------------------------------------------------------

at::Tensor HostAliases::of(const at::Tensor& t) {
  c10::StorageImpl* device = t.storage().unsafeGetStorageImpl();
  auto [it, fresh] = by_device_.try_emplace(device, entries_.size());
  if (fresh) {
    auto* keep_alive = new c10::Storage(t.storage());
    c10::DataPtr data(
        device->mutable_data(), keep_alive, [](void* s) { delete static_cast<c10::Storage*>(s); },
        c10::Device(c10::kCPU));
    // Resizable with the CPU allocator: an out= kernel that grows its output
    // moves it to host memory, and the fallback moves it back.
    c10::Storage host(c10::Storage::use_byte_size_t(), device->nbytes(), std::move(data), c10::GetCPUAllocator(),
                      /*resizable=*/true);
    by_host_.emplace(host.unsafeGetStorageImpl(), entries_.size());
    entries_.push_back({t.storage(), std::move(host)});
  }
  at::Tensor h = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(entries_[it->second].host),
                                                          c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  h.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  if (t.is_conj()) h._set_conj(true);
  if (t.is_neg()) h._set_neg(true);
  return h;
}

const HostAliases::Entry* HostAliases::by_host(const c10::StorageImpl* host) const {
  auto it = by_host_.find(host);
  return it == by_host_.end() ? nullptr : &entries_[it->second];
}

void check_memory(const at::Tensor& t, std::string_view op, std::string_view arg) {
  if (!t.has_storage()) return;
  const c10::Storage& s = t.storage();
  const c10::Device home = s.device();
  TORCH_CHECK(home == t.device(), op, ": argument '", arg, "' is a tensor on ", t.device(),
              " but its memory was allocated on ", home, " (", home,
              " was the current device when the memory was allocated: a missing device guard or set_device?)");
  if (t.numel() == 0) return;
  const size_t needed = at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.dtype().itemsize(),
                                                         static_cast<size_t>(t.storage_offset()));
  TORCH_CHECK(needed <= s.nbytes(), op, ": argument '", arg, "' on ", t.device(), " reaches byte ", needed,
              " of its storage, which holds ", s.nbytes(), s.nbytes() == 0 ? " (released)" : "");
}

at::Tensor empty_on(c10::Device device, c10::IntArrayRef sizes, c10::IntArrayRef strides, caffe2::TypeMeta dtype) {
  const c10::DeviceGuard guard(device);
  return at::detail::empty_strided_generic(sizes, strides, &device_memory(), kDeviceKeys, dtype.toScalarType());
}

namespace {

// ---- factories: memory on the requested device, under a guard for it, as
// CUDA's kernels take it -----------------------------------------------------

void check_factory_options(std::optional<at::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == at::Layout::Strided, "zdev: only strided tensors");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "Only dense CPU tensors can be pinned");
}

at::Tensor empty_memory_format(c10::SymIntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory, std::optional<at::MemoryFormat> memory_format) {
  check_factory_options(layout, pin_memory);
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_generic(C10_AS_INTARRAYREF_SLOW(size), &device_memory(), kDeviceKeys,
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> pin_memory) {
  check_factory_options(layout, pin_memory);
  const c10::DeviceGuard guard(c10::device_or_default(device));
  return at::detail::empty_strided_generic(C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                                           &device_memory(), kDeviceKeys, c10::dtype_or_default(dtype));
}

// ---- views: new tensors over the same storage; nothing is read ------------------

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset) offset = storage_offset->expect_int();
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                                           offset);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor unfold(const at::Tensor& self, int64_t dimension, int64_t size, int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}

// ---- storage: a block that grows is taken on the tensor's device -------------

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, c10::SymInt storage_offset, c10::SymIntArrayRef size,
                        c10::SymIntArrayRef stride) {
  const c10::DeviceGuard guard(self.device());
  return at::native::set_storage_cpu_(self, std::move(source), storage_offset.expect_int(),
                                      C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_whole_storage(at::Tensor& self, c10::Storage source) {
  return at::native::set_(self, std::move(source));
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) { return at::native::set_tensor_(self, source); }

at::Tensor& set_empty(at::Tensor& self) {
  const c10::DeviceGuard guard(self.device());
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, &device_memory(), /*resizable=*/true);
  return self.set_(std::move(empty), 0, {0}, {});
}

bool is_set_to(const at::Tensor& self, const at::Tensor& tensor) { return at::native::is_set_to(self, tensor); }

// Variable::set_data (Module::to's move) lets a dense tensor of one backend
// take a dense tensor of another's place, CPU <-> CUDA; TensorImpl's list of
// dense backends has no PrivateUse1.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == at::kStrided && (t.is_cpu() || t.is_cuda() || on_test_device(t));
  };
  return self.unsafeGetTensorImpl()->has_compatible_shallow_copy_type(from.key_set()) || (dense(self) && dense(from));
}

// Kernels run in order on the calling thread: no block is reused early.
void record_stream(at::Tensor& /*self*/, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1, "zdev: record_stream on a ", stream.device(),
              " stream");
}

// ---- copies: host<->device and device<->device, counted ---------------------

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  constexpr std::string_view op = "aten::_copy_from";
  TORCH_CHECK((self.is_cpu() || on_test_device(self)) && (dst.is_cpu() || on_test_device(dst)),
              "zdev: cannot copy from ", self.device(), " to ", dst.device());
  if (on_test_device(self)) check_memory(self, op, "self");
  if (on_test_device(dst)) check_memory(dst, op, "dst");
  if (dst.numel() == 0) return dst;
  if (!on_test_device(dst)) {
    const bool into_pinned = pinned_host_memory().is_pinned(dst.const_data_ptr());
    count_transfer(Transfer::DeviceToHost, !(non_blocking && into_pinned));
  } else if (!on_test_device(self)) {
    count_transfer(Transfer::HostToDevice, false, !pinned_host_memory().is_pinned(self.const_data_ptr()));
  } else if (self.device() != dst.device()) {
    count_transfer(Transfer::DeviceToDevice, false);
  }
  HostAliases aliases;
  const at::Tensor host_self = on_test_device(self) ? aliases.of(self) : self;
  const at::Tensor host_dst = on_test_device(dst) ? aliases.of(dst) : dst;
  const c10::DeviceGuard guard(on_test_device(dst) ? dst.device() : self.device());
  host_dst.copy_(host_self);
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  dst.resize_(self.sizes());
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  check_memory(self, "aten::_local_scalar_dense", "self");
  count_transfer(Transfer::DeviceToHost, true);
  HostAliases aliases;
  return at::_local_scalar_dense(aliases.of(self));
}

// Ops with a CPU kernel of their own and a composite one that other backends
// get: zdev runs the CPU kernel (through the fallback), so that it computes
// exactly what the CPU computes (native_layer_norm's composite rounds
// differently; mse_loss's resizes its output and warns) -- except the ones
// above, which have zdev kernels.
void send_cpu_kernel_ops_to_fallback(torch::Library& lib) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNamesForDispatchKey(c10::DispatchKey::CPU)) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op || op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    // (Not the CompositeImplicitAutograd ones: a backend kernel would take
    // their autograd, which is the composite's, away.)
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) {
      continue;
    }
    const std::string qualified = name.overload_name.empty() ? name.name : name.name + "." + name.overload_name;
    lib.impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
}

}  // namespace

// scaled_dot_product_attention asks a PrivateUse1 backend which fused kernel
// to run through this stub (math when none is set): the CPU's answer, so a
// zdev run takes the CPU's flash kernel (through the fallback) and equals a
// CPU run bit for bit, as a CUDA run takes CUDA's flash kernel.
int64_t sdp_choice_as_on_the_cpu(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                 const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                                 std::optional<double> scale, bool enable_gqa) {
  return at::native::_fused_sdp_choice_cpp(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

void register_kernels() {
  at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(&sdp_choice_as_on_the_cpu);
  // Leaked: the registrations last as long as the Library objects do.
  auto* kernels = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  kernels->impl("empty.memory_format", TORCH_FN(empty_memory_format));
  kernels->impl("empty_strided", TORCH_FN(empty_strided));
  kernels->impl("view", TORCH_FN(view));
  kernels->impl("as_strided", TORCH_FN(as_strided));
  kernels->impl("_reshape_alias", TORCH_FN(reshape_alias));
  kernels->impl("unfold", TORCH_FN(unfold));
  kernels->impl("resize_", TORCH_FN(resize_));
  kernels->impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage));
  kernels->impl("set_.source_Storage", TORCH_FN(set_whole_storage));
  kernels->impl("set_.source_Tensor", TORCH_FN(set_tensor));
  kernels->impl("set_", TORCH_FN(set_empty));
  kernels->impl("is_set_to", TORCH_FN(is_set_to));
  kernels->impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  kernels->impl("record_stream", TORCH_FN(record_stream));
  kernels->impl("_copy_from", TORCH_FN(copy_from));
  kernels->impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  kernels->impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  send_cpu_kernel_ops_to_fallback(*kernels);

  auto* rest = new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  rest->fallback(torch::CppFunction::makeFromBoxedFunction<&fallback>());
}

}  // namespace zero::test_device::detail
