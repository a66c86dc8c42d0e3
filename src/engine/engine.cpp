// The engine façade: builds the flat groups for the configured stage, scales
// backward, and runs the optimizer step (overflow check, clipping, fused
// update, all-gather). Backward-time reduction lives in zero/grad_reducer.
#include "zero/engine.h"

#include <cmath>
#include <set>
#include <sstream>
#include <unordered_set>

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/nn/module.h>

#include "optim/kernels.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "partition/flat_group.h"
#include "zero/grad_reducer.h"

namespace zero {

namespace {

// Shards start on 64-byte boundaries for fp32 (16 elements), so the
// optimizer's vector loops never straddle a shard edge.
constexpr int64_t kAlignElements = 16;

at::ScalarType to_scalar_type(DType d) {
  switch (d) {
    case DType::bf16: return at::kBFloat16;
    case DType::fp16: return at::kHalf;
    default: return at::kFloat;
  }
}

optim::Out16 out16_kind(at::ScalarType t) {
  return t == at::kBFloat16 ? optim::Out16::BF16 : t == at::kHalf ? optim::Out16::FP16 : optim::Out16::None;
}

int64_t storage_bytes(const at::Tensor& t) {
  return t.defined() ? static_cast<int64_t>(t.storage().nbytes()) : 0;
}

bool same_storage(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}

}  // namespace

at::Tensor compute(const at::Tensor& t) { return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat); }

struct Engine::Impl {
  Config config;
  BatchConfig batch;
  comm::Comm& comm;
  std::shared_ptr<comm::Group> dp_owner;
  const comm::Group& dp;
  int stage;
  at::ScalarType param_dtype;
  at::ScalarType grad_dtype;
  std::vector<partition::FlatGroup> groups;
  std::shared_ptr<GradReducer> reducer;
  optim::LossScaler scaler;
  int64_t num_params = 0;
  int64_t micro_steps = 0;
  int64_t global_steps = 0;
  int64_t skipped_steps = 0;
  int64_t optimizer_steps = 0;   // updates applied (bias correction / momentum start)
  int64_t scheduler_iter = -1;   // DeepSpeed's last_batch_iteration
  double last_grad_norm = 0.0;
  int64_t largest_group_bytes = 0;  // the flatten's extra peak over the model itself

  Impl(torch::nn::Module& model, const Config& c, comm::Comm& cm, std::shared_ptr<comm::Group> owner,
       const comm::Group& group)
      : config(c), comm(cm), dp_owner(std::move(owner)), dp(group), stage(static_cast<int>(c.zero.stage)),
        param_dtype(to_scalar_type(c.param_dtype())),
        grad_dtype(to_scalar_type(c.grad_accum_dtype.value_or(c.param_dtype()))),
        scaler(c.fp16) {
    validate();
    optim::set_kernel_threads(at::get_num_threads());
    batch = config.resolve_batch(dp.size());
    build_groups(model);
    reducer = std::make_shared<GradReducer>(
        groups, comm, dp,
        ReducerOptions{stage, config.zero.overlap_comm(), config.zero.contiguous_gradients, grad_dtype});
    reducer->install_hooks();
  }

  void validate() const {
    if (stage == 3)
      throw ConfigError("ds_config: zero_optimization.stage = 3 is not available yet in zero-cpp (stages 0, 1, 2 are)");
    if (!config.optimizer.given)
      throw ConfigError("ds_config: an \"optimizer\" block is required (Adam, AdamW or SGD)");
    if (to_scalar_type(config.comm_dtype()) != grad_dtype)
      throw ConfigError(std::string("ds_config: communication_data_type = ") + to_string(config.comm_dtype()) +
                        " differs from the grad dtype (" + c10::toString(grad_dtype) +
                        "); zero-cpp communicates grads in their accumulation dtype");
    if (config.zero.offload_param.device != OffloadDevice::None)
      throw ConfigError("ds_config: zero_optimization.offload_param needs stage 3");
  }

  // Params in reverse registration order (about the order backward produces
  // their grads), bucketed by reduce_bucket_size, each bucket flattened in place.
  void build_groups(torch::nn::Module& model) {
    std::vector<at::Tensor> params;
    std::vector<std::string> names;
    std::unordered_set<const void*> seen;
    for (const auto& item : model.named_parameters(/*recurse=*/true)) {
      const at::Tensor& p = item.value();
      if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
      if (p.scalar_type() != at::kFloat)
        throw std::invalid_argument("zero::Engine: param " + item.key() + " is " + c10::toString(p.scalar_type()) +
                                    "; build the model in fp32 (the engine casts to bf16/fp16 as configured)");
      if (!p.is_cpu())
        throw std::invalid_argument("zero::Engine: param " + item.key() + " is not on the CPU; this build runs on CPU");
      params.push_back(p);
      names.push_back(item.key());
    }
    if (params.empty()) throw std::invalid_argument("zero::Engine: the model has no trainable parameters");

    std::vector<int64_t> order_numels, order_indices;
    for (int64_t i = static_cast<int64_t>(params.size()) - 1; i >= 0; --i) {
      order_numels.push_back(params[i].numel());
      order_indices.push_back(i);
      num_params += params[i].numel();
    }
    for (const auto& bucket : partition::bucket_params(order_numels, order_indices, config.zero.reduce_bucket_size)) {
      partition::FlatGroup g;
      std::vector<int64_t> numels;
      for (int64_t i : bucket) {
        numels.push_back(params[i].numel());
        g.params.push_back(params[i]);
        g.names.push_back(names[i]);
      }
      g.layout = partition::make_group_layout(numels, bucket, dp.size(), kAlignElements);
      partition::flatten_into_group(g, at::kFloat);
      largest_group_bytes = std::max(largest_group_bytes, g.layout.padded_numel * 4);
      // Every rank starts from rank 0's weights (as DeepSpeed's engine does).
      comm.broadcast(dp, g.param_flat, 0)->wait();
      setup_precision_and_state(g);
      groups.push_back(std::move(g));
    }
  }

  void setup_precision_and_state(partition::FlatGroup& g) {
    at::NoGradGuard no_grad;
    const bool sharded = stage >= 1;
    at::Tensor fp32_view = sharded ? g.own_slot(g.param_flat, dp.rank()) : g.param_flat;
    if (param_dtype == at::kFloat) {
      g.master = fp32_view;  // the optimizer updates the params in place
    } else {
      g.master = fp32_view.clone();
      at::Tensor low = g.param_flat.to(param_dtype);
      for (size_t i = 0; i < g.params.size(); ++i) {
        const auto& s = g.layout.params[i];
        g.params[i].set_data(low.narrow(0, s.offset, s.numel).view(g.params[i].sizes()));
      }
      g.param_flat = low;  // the fp32 flat buffer is released here
    }
    g.exp_avg = at::zeros_like(g.master);
    if (config.optimizer.type != OptimizerType::SGD) g.exp_avg_sq = at::zeros_like(g.master);
    else if (config.optimizer.momentum == 0.0) g.exp_avg = at::Tensor();
  }

  bool boundary() const { return (micro_steps + 1) % batch.gradient_accumulation_steps == 0; }

  // The fp32 grads the optimizer reads for group g (a shard, or all of it in stage 0).
  at::Tensor optimizer_grads(const partition::FlatGroup& g) const {
    if (stage == 0) return g.grad_flat.scalar_type() == at::kFloat ? g.grad_flat : g.grad_flat.to(at::kFloat);
    return g.grad_shard;
  }

  // Sum of squares of the global (loss-scaled) grads; inf/nan if any grad is.
  double global_sumsq(const std::vector<at::Tensor>& grads) {
    auto acc = at::zeros({1}, at::TensorOptions().dtype(at::kDouble));
    // Per-group norms in fp32 (no double copy of the grads), squared and summed in fp64.
    for (const auto& gr : grads) acc += at::norm(gr).to(at::kDouble).pow(2);
    // Stage 0 grads are already identical on every rank; shards are summed.
    if (stage >= 1) comm.all_reduce(dp, acc, comm::ReduceOp::Sum)->wait();
    return acc.item<double>();
  }

  bool step() {
    if (!boundary()) {
      ++micro_steps;
      return false;
    }
    std::vector<at::Tensor> grads;
    for (const auto& g : groups) grads.push_back(optimizer_grads(g));
    const double sumsq = global_sumsq(grads);
    const double scale = scaler.scale();
    const bool check_overflow = config.fp16.enabled || config.bf16.enabled;
    if (check_overflow && !std::isfinite(sumsq)) {
      scaler.update(true);  // throws at the minimum scale, as DeepSpeed
      ++skipped_steps;
      finish_step();
      return false;
    }
    last_grad_norm = std::sqrt(sumsq) / scale;
    // DeepSpeed's clip: divide by (norm + 1e-6) / max_norm when that exceeds 1.
    float grad_scale = static_cast<float>(1.0 / scale);
    if (config.gradient_clipping > 0) {
      const double clip = (last_grad_norm + 1e-6) / config.gradient_clipping;
      if (clip > 1.0) grad_scale = static_cast<float>(1.0 / (scale * clip));
    }
    const double lr = current_lr();
    ++optimizer_steps;
    for (size_t i = 0; i < groups.size(); ++i) update_group(groups[i], grads[i], lr, grad_scale);
    if (stage >= 1) {
      std::vector<comm::WorkHandle> works;
      for (auto& g : groups) works.push_back(comm.all_gather(dp, g.param_flat, g.own_slot(g.param_flat, dp.rank())));
      for (auto& w : works) w->wait();
    }
    scaler.update(false);
    ++scheduler_iter;
    ++global_steps;
    finish_step();
    return true;
  }

  void update_group(partition::FlatGroup& g, const at::Tensor& grad, double lr, float grad_scale) {
    const int64_t n = g.master.numel();
    void* out16 = nullptr;
    const auto kind = out16_kind(param_dtype);
    if (kind != optim::Out16::None)
      out16 = (stage == 0 ? g.param_flat : g.own_slot(g.param_flat, dp.rank())).data_ptr();
    const auto& o = config.optimizer;
    if (o.type == OptimizerType::SGD) {
      optim::SgdHyper h{static_cast<float>(lr), static_cast<float>(o.momentum), static_cast<float>(o.dampening),
                        static_cast<float>(o.weight_decay), o.nesterov, optimizer_steps == 1};
      optim::sgd_update(g.master.data_ptr<float>(), grad.data_ptr<float>(),
                        g.exp_avg.defined() ? g.exp_avg.data_ptr<float>() : nullptr, n, h, grad_scale, out16, kind);
    } else {
      optim::AdamHyper h{static_cast<float>(lr), static_cast<float>(o.betas[0]), static_cast<float>(o.betas[1]),
                         static_cast<float>(o.eps), static_cast<float>(o.weight_decay), optimizer_steps,
                         o.adam_w_mode, true};
      optim::adam_update(g.master.data_ptr<float>(), grad.data_ptr<float>(), g.exp_avg.data_ptr<float>(),
                         g.exp_avg_sq.data_ptr<float>(), n, h, grad_scale, out16, kind);
    }
  }

  void finish_step() {
    reducer->zero_grads();
    ++micro_steps;
  }

  double current_lr() const { return optim::scheduled_lr(config.scheduler, config.optimizer.lr, scheduler_iter); }

  StateBytes state_bytes() const {
    StateBytes b;
    for (const auto& g : groups) {
      b.params += storage_bytes(g.param_flat);
      b.grads += storage_bytes(g.grad_flat);
      if (!same_storage(g.grad_shard, g.grad_flat)) b.grads += storage_bytes(g.grad_shard);
      if (!same_storage(g.master, g.param_flat)) b.master += storage_bytes(g.master);
      b.optimizer += storage_bytes(g.exp_avg) + storage_bytes(g.exp_avg_sq);
    }
    return b;
  }
};

Engine::Engine(torch::nn::Module& model, const Config& config, World& world)
    : impl_(std::make_unique<Impl>(model, config, world.comm(), nullptr, world.group())) {}

Engine::Engine(torch::nn::Module& model, const Config& config, comm::Comm& comm, std::shared_ptr<comm::Group> dp)
    : impl_(dp ? std::make_unique<Impl>(model, config, comm, dp, *dp)
               : throw std::invalid_argument("zero::Engine: the data-parallel group is null (not a member?)")) {}

Engine::~Engine() = default;

at::Tensor Engine::backward(const at::Tensor& loss) {
  if (!loss.defined() || loss.numel() != 1)
    throw std::invalid_argument("zero::Engine::backward: the loss must be a scalar tensor");
  if (!loss.requires_grad())
    throw std::invalid_argument("zero::Engine::backward: the loss does not require grad (computed under no_grad?)");
  auto& m = *impl_;
  const double gas = static_cast<double>(m.batch.gradient_accumulation_steps);
  m.reducer->begin_backward(m.stage == 2 || m.boundary());
  try {
    torch::autograd::backward({loss * (m.scaler.scale() / gas)});
  } catch (...) {
    m.reducer->end_backward();
    throw;
  }
  m.reducer->end_backward();
  return loss.detach() / gas;
}

bool Engine::step() { return impl_->step(); }
void Engine::zero_grad() { impl_->reducer->zero_grads(); }
bool Engine::is_gradient_accumulation_boundary() const { return impl_->boundary(); }
int64_t Engine::global_steps() const { return impl_->global_steps; }
int64_t Engine::skipped_steps() const { return impl_->skipped_steps; }
int64_t Engine::micro_steps() const { return impl_->micro_steps; }
double Engine::loss_scale() const { return impl_->scaler.scale(); }
double Engine::lr() const { return impl_->current_lr(); }
double Engine::last_grad_norm() const { return impl_->last_grad_norm; }
const Config& Engine::config() const { return impl_->config; }
const BatchConfig& Engine::batch() const { return impl_->batch; }
const comm::Group& Engine::dp_group() const { return impl_->dp; }
comm::Comm& Engine::comm() { return impl_->comm; }
int64_t Engine::num_params() const { return impl_->num_params; }
StateBytes Engine::state_bytes() const { return impl_->state_bytes(); }

std::string Engine::describe() const {
  const auto& m = *impl_;
  int64_t padded = 0;
  for (const auto& g : m.groups) padded += g.layout.padded_numel;
  std::ostringstream os;
  os << "ZeRO stage " << m.stage << " on " << m.dp.describe() << ": " << m.num_params << " params in "
     << m.groups.size() << " flat groups (" << padded << " padded), params " << c10::toString(m.param_dtype)
     << ", grads " << c10::toString(m.grad_dtype) << ", " << to_string(m.config.optimizer.type)
     << " kernel " << optim::kernel_isa() << ", micro-batch " << m.batch.micro_batch_per_gpu
     << " x accumulation " << m.batch.gradient_accumulation_steps << " x dp " << m.dp.size()
     << "; init flattened params in place, group by group (peak over the model: largest group, "
     << m.largest_group_bytes / (1 << 20) << " MiB)";
  return os.str();
}

}  // namespace zero
