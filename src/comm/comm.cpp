// The collective dispatcher: argument checks, counters, and routing between
// fast paths and the backend. Also the shared Work handle types.
#include <algorithm>
#include <optional>
#include <sstream>
#include <utility>

#include <ATen/core/grad_mode.h>

#include "comm/comm_log.h"
#include "comm/group_impl.h"
#include "comm/work.h"
#include "zero/comm.h"

namespace zero::comm {

CommError::CommError(const std::string& what) : std::runtime_error(what) {
  if (says_peer_lost(what)) note_peer_lost(what);
}

// ---- work handles ------------------------------------------------------------

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

BackendWork::BackendWork(c10::intrusive_ptr<c10d::Work> work, std::function<void()> finish, std::string what,
                         std::chrono::milliseconds timeout, std::shared_ptr<const std::atomic<bool>> closing)
    : work_(std::move(work)),
      finish_(std::move(finish)),
      what_(std::move(what)),
      timeout_(timeout),
      closing_(std::move(closing)) {}

// In slices, so that a shutdown is noticed within one: c10d's wait with a
// timeout throws when the slice ends with the work still running.
void BackendWork::wait_for_peers() {
  if (!closing_ || timeout_.count() <= 0) {
    work_->wait(timeout_);  // 0: kNoTimeout (NCCL: the caller's stream waits, the host does not)
    return;
  }
  constexpr std::chrono::milliseconds kSlice{100};
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    try {
      work_->wait(std::max(std::chrono::milliseconds(1), std::min(kSlice, left)));
      return;
    } catch (...) {
      // The slice can end just as the peers arrive: a work completed by now
      // answers with its own result (done, or its own error), not the slice's
      // timeout (a world barrier failed so in CI after 114 ms).
      if (work_->isCompleted()) {
        work_->wait(kSlice);
        return;
      }
      if (left <= kSlice) throw;  // the collective timeout
      if (closing_->load(std::memory_order_acquire))
        throw std::runtime_error("its group was shut down while this rank waited for its peers");
    }
  }
}

void BackendWork::wait() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) {
    done_ = true;
    const auto start = std::chrono::steady_clock::now();
    try {
      wait_for_peers();
      if (finish_) finish_();
    } catch (const std::exception& e) {
      std::ostringstream os;
      os << what_ << " failed";
      // The timeout is named only when it ran out: a peer that closed its
      // connection fails the wait at once.
      const bool timed_out = timeout_.count() > 0 && std::chrono::steady_clock::now() - start >= timeout_;
      if (timed_out) os << " (collective timeout " << timeout_.count() / 1000.0 << " s)";
      os << ": " << first_line(e.what());
      error_ = os.str();
    }
    finish_ = nullptr;
  }
  if (error_) throw CommError(*error_);
}

bool BackendWork::is_completed() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ || work_->isCompleted();
}

namespace {
class CompletedWork : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return true; }
};
}  // namespace

WorkHandle completed_work() { return std::make_shared<CompletedWork>(); }

// ---- groups ------------------------------------------------------------------

Group::Group(std::string name, std::vector<int> global_ranks, int rank, std::shared_ptr<Impl> impl)
    : name_(std::move(name)), global_ranks_(std::move(global_ranks)), rank_(rank), impl_(std::move(impl)) {}

bool Group::shut_down() const { return impl_ && impl_->closed(); }

void Group::set_step(int64_t step, int64_t micro, const void* owner) const {
  if (!impl_) return;
  impl_->step_owner.store(owner, std::memory_order_relaxed);
  impl_->micro.store(micro, std::memory_order_relaxed);
  impl_->step.store(step, std::memory_order_release);
}

void Group::clear_step(const void* owner) const {
  if (!impl_) return;
  const void* expected = owner;
  if (impl_->step_owner.compare_exchange_strong(expected, nullptr, std::memory_order_acq_rel))
    impl_->step.store(-1, std::memory_order_release);
}

std::string Group::step_tag() const {
  if (!impl_) return {};
  const int64_t step = impl_->step.load(std::memory_order_acquire);
  if (step < 0) return {};
  return "step " + std::to_string(step) + "." + std::to_string(impl_->micro.load(std::memory_order_relaxed));
}

std::string Group::describe() const {
  std::ostringstream os;
  os << "group '" << name_ << "' (ranks ";
  for (size_t i = 0; i < global_ranks_.size(); ++i) os << (i ? "," : "") << global_ranks_[i];
  os << ")";
  return os.str();
}

// ---- dispatcher --------------------------------------------------------------

namespace {

[[noreturn]] void bad_args(CollectiveOp op, const Group& g, const std::string& what) {
  throw CommError(std::string(to_string(op)) + " on " + g.describe() + ": " + what);
}

void check_dense(CollectiveOp op, const Group& g, const at::Tensor& t, const char* role) {
  if (!t.defined()) bad_args(op, g, std::string(role) + " is undefined");
  if (!t.is_contiguous()) bad_args(op, g, std::string(role) + " must be contiguous");
}

void check_same_device(CollectiveOp op, const Group& g, const at::Tensor& out, const at::Tensor& in) {
  if (out.device() != in.device())
    bad_args(op, g, "output is on " + out.device().str() + " and input on " + in.device().str() +
                        " (both must be on one device)");
}

// "reduce_scatter of 4096 BFloat16 into Float [grads of unit 'h3']": what the
// ranks of the group must agree on (numel is the full buffer's).
// The group's step tag leads (the record keeps only its first 120 bytes for
// messages; the hash covers it all).
Signature signature(const Group& g, CollectiveOp op, std::optional<std::pair<at::ScalarType, int64_t>> payload,
                    std::string_view label, const std::string& extra = {}) {
  const std::string tag = g.step_tag();
  std::string s = tag.empty() ? std::string() : "[" + tag + "] ";
  s += to_string(op);
  if (payload) s += " of " + std::to_string(payload->second) + " " + c10::toString(payload->first);
  s += extra;
  if (!label.empty()) s.append(" [").append(label).append("]");
  return {s};
}

Signature signature(const Group& g, CollectiveOp op, const at::Tensor& full, std::string_view label,
                    const std::string& extra = {}) {
  return signature(g, op,
                   full.defined() ? std::make_optional(std::make_pair(full.scalar_type(), full.numel())) : std::nullopt,
                   label, extra);
}

}  // namespace

Comm::Comm(std::shared_ptr<Transport> backend) : backend_(std::move(backend)) {}

void Comm::add_fast_path(std::shared_ptr<Transport> t) { fast_paths_.push_back(std::move(t)); }

void Comm::set_device_transport(c10::DeviceType type, std::shared_ptr<Transport> t) {
  for (auto& [dt, d] : devices_)
    if (dt == type) {
      d.backend = std::move(t);
      return;
    }
  devices_.push_back({type, DeviceTransports{std::move(t), {}}});
}

void Comm::add_device_fast_path(c10::DeviceType type, std::shared_ptr<Transport> t) {
  for (auto& [dt, d] : devices_)
    if (dt == type) {
      d.fast_paths.push_back(std::move(t));
      return;
    }
  devices_.push_back({type, DeviceTransports{nullptr, {std::move(t)}}});
}

void Comm::serve_as_host_memory(c10::DeviceType type) {
  if (!serves_as_host(type)) host_memory_devices_.push_back(type);
}

bool Comm::serves_as_host(c10::DeviceType type) const {
  return std::find(host_memory_devices_.begin(), host_memory_devices_.end(), type) != host_memory_devices_.end();
}

bool Comm::serves(c10::DeviceType type) const {
  if (type == c10::DeviceType::CPU || serves_as_host(type)) return true;
  for (const auto& [dt, d] : devices_)
    if (dt == type && d.backend) return true;
  return false;
}

at::Tensor Comm::host_view(const at::Tensor& t) const {
  if (!t.defined() || t.is_cpu() || !serves_as_host(t.device().type())) return t;
  // The same bytes seen as a CPU tensor; the view keeps the storage alive
  // for as long as an asynchronous collective holds it.
  c10::Storage keep = t.storage();
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), [keep](void*) {}, t.options().device(at::kCPU));
}

Transport& Comm::route(const Group& g, CollectiveOp op, const at::Tensor& t) {
  return route(g, op, t.scalar_type(), t.numel(), t.device());
}

Transport& Comm::route(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel, at::Device device) {
  if (g.shut_down()) bad_args(op, g, "the world was shut down (World::shutdown(), or the program is exiting)");
  if (!device.is_cpu() && !serves_as_host(device.type())) {
    for (auto& [type, d] : devices_) {
      if (type != device.type() || !d.backend) continue;
      if (fast_paths_enabled_)
        for (auto& fp : d.fast_paths)
          if (fp->supports_on(g, op, dtype, numel, device)) return *fp;
      return *d.backend;
    }
    if (device.is_cuda())
      bad_args(op, g, "a CUDA tensor, but this zero-cpp was built without CUDA (ZERO_CUDA: nvcc and a CUDA "
                      "libtorch at configure time)");
    bad_args(op, g, "tensors on " + device.str() + " are not supported (CPU or CUDA)");
  }
  if (fast_paths_enabled_)
    for (auto& fp : fast_paths_)
      if (fp->supports(g, op, dtype, numel)) return *fp;
  return *backend_;
}

std::string Comm::route_name(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel,
                             at::Device device) {
  try {
    return route(g, op, dtype, numel, device).name();
  } catch (const CommError& e) {
    return std::string("none: ") + e.what();
  }
}

WorkHandle Comm::count(const Group& g, CollectiveOp op, Transport& t, const at::Tensor& full, WorkHandle w) {
  if (!full.defined()) {
    counters_.record(g.name(), op, t.name(), 0, 0);
    return w;
  }
  return count(g, op, t, full.scalar_type(), full.numel(), std::move(w));
}

WorkHandle Comm::count(const Group& g, CollectiveOp op, Transport& t, at::ScalarType dtype, int64_t numel,
                       WorkHandle w) {
  counters_.record(g.name(), op, t.name(), numel * static_cast<int64_t>(c10::elementSize(dtype)),
                   t.wire_bytes(g, op, dtype, numel));
  return w;
}

WorkHandle Comm::all_gather(const Group& g, at::Tensor out_flat, at::Tensor in_shard, std::string_view label) {
  const auto op = CollectiveOp::AllGather;
  check_dense(op, g, out_flat, "output");
  check_dense(op, g, in_shard, "input");
  check_same_device(op, g, out_flat, in_shard);
  // Widening: 16-bit shards gathered into an fp32 buffer (mixed precision
  // with fp32 compute), converted as they land.
  const bool widening = out_flat.scalar_type() == at::kFloat &&
                        (in_shard.scalar_type() == at::kHalf || in_shard.scalar_type() == at::kBFloat16);
  if (out_flat.scalar_type() != in_shard.scalar_type() && !widening)
    bad_args(op, g, "output dtype must equal the input's, or be fp32 for a 16-bit input");
  if (out_flat.numel() != in_shard.numel() * g.size())
    bad_args(op, g, "output has " + std::to_string(out_flat.numel()) + " elements, expected " +
                        std::to_string(g.size()) + " x " + std::to_string(in_shard.numel()));
  Transport& t = route(g, op, in_shard);
  // Counted and signed in the dtype that travels (the input's).
  const auto sent = std::make_pair(in_shard.scalar_type(), out_flat.numel());
  const auto issued = comm_log::Clock::now();
  return comm_log::timed(
      op, in_shard.numel() * static_cast<int64_t>(in_shard.element_size()), g.size(), issued,
      count(g, op, t, sent.first, sent.second,
            t.all_gather(g, host_view(out_flat).view(-1), host_view(in_shard).view(-1), signature(g, op, sent, label))));
}

WorkHandle Comm::reduce_scatter(const Group& g, at::Tensor out_shard, at::Tensor in_flat, ReduceOp rop,
                                std::string_view label) {
  const auto op = CollectiveOp::ReduceScatter;
  check_dense(op, g, out_shard, "output");
  check_dense(op, g, in_flat, "input");
  check_same_device(op, g, out_shard, in_flat);
  const bool widening = out_shard.scalar_type() == at::kFloat &&
                        (in_flat.scalar_type() == at::kHalf || in_flat.scalar_type() == at::kBFloat16);
  if (out_shard.scalar_type() != in_flat.scalar_type() && !widening)
    bad_args(op, g, "output dtype must equal the input's, or be fp32 for a 16-bit input");
  if (in_flat.numel() != out_shard.numel() * g.size())
    bad_args(op, g, "input has " + std::to_string(in_flat.numel()) + " elements, expected " +
                        std::to_string(g.size()) + " x " + std::to_string(out_shard.numel()));
  Transport& t = route(g, op, in_flat);
  const std::string extra = std::string(rop == ReduceOp::Avg ? " (avg)" : " (sum)") +
                            (widening ? std::string(" into ") + c10::toString(out_shard.scalar_type()) : "");
  const auto issued = comm_log::Clock::now();
  return comm_log::timed(
      op, in_flat.nbytes(), g.size(), issued,
      count(g, op, t, in_flat,
            t.reduce_scatter(g, host_view(out_shard).view(-1), host_view(in_flat).view(-1), rop,
                             signature(g, op, in_flat, label, extra))));
}

WorkHandle Comm::all_reduce(const Group& g, at::Tensor tensor, ReduceOp rop, std::string_view label) {
  const auto op = CollectiveOp::AllReduce;
  check_dense(op, g, tensor, "tensor");
  Transport& t = route(g, op, tensor);
  const auto issued = comm_log::Clock::now();
  return comm_log::timed(op, tensor.nbytes(), g.size(), issued,
                         count(g, op, t, tensor,
                               t.all_reduce(g, host_view(tensor), rop,
                                            signature(g, op, tensor, label, rop == ReduceOp::Avg ? " (avg)" : " (sum)"))));
}

WorkHandle Comm::broadcast(const Group& g, at::Tensor tensor, int root, std::string_view label) {
  const auto op = CollectiveOp::Broadcast;
  check_dense(op, g, tensor, "tensor");
  if (root < 0 || root >= g.size())
    bad_args(op, g, "root " + std::to_string(root) + " is not a rank of the group (0.." +
                        std::to_string(g.size() - 1) + ")");
  Transport& t = route(g, op, tensor);
  const auto issued = comm_log::Clock::now();
  return comm_log::timed(op, tensor.nbytes(), g.size(), issued,
                         count(g, op, t, tensor,
                               t.broadcast(g, host_view(tensor), root,
                                           signature(g, op, tensor, label, " from rank " + std::to_string(root)))));
}

WorkHandle Comm::barrier(const Group& g) {
  if (g.shut_down())
    bad_args(CollectiveOp::Barrier, g, "the world was shut down (World::shutdown(), or the program is exiting)");
  Transport& t = *backend_;
  const auto issued = comm_log::Clock::now();
  return comm_log::timed(CollectiveOp::Barrier, 0, g.size(), issued,
                         count(g, CollectiveOp::Barrier, t, at::Tensor(),
                               t.barrier(g, signature(g, CollectiveOp::Barrier, std::nullopt, {}))));
}

void Comm::broadcast_coalesced(const Group& g, const std::vector<at::Tensor>& tensors, int root,
                               std::string_view label) {
  // One flat buffer per dtype, in the tensors' order (the same on every rank).
  std::vector<at::ScalarType> dtypes;
  for (const auto& t : tensors)
    if (std::find(dtypes.begin(), dtypes.end(), t.scalar_type()) == dtypes.end()) dtypes.push_back(t.scalar_type());
  for (auto dt : dtypes) {
    std::vector<at::Tensor> parts;
    for (const auto& t : tensors)
      if (t.scalar_type() == dt && t.numel() > 0) parts.push_back(t);
    if (parts.empty()) continue;
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : parts) flat_parts.push_back(t.reshape(-1));
    at::Tensor flat = at::cat(flat_parts);
    broadcast(g, flat, root, label)->wait();
    if (g.rank() == root) continue;
    at::NoGradGuard no_grad;
    int64_t offset = 0;
    for (auto& t : parts) {
      t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

}  // namespace zero::comm
