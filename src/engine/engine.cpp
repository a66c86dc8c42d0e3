// The engine façade: builds the flat groups for the configured stage, scales
// backward, and runs the optimizer step (overflow check, clipping, fused
// update, all-gather). Backward-time reduction lives in zero/grad_reducer.
#include <exception>

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

#include "engine/engine_impl.h"

namespace zero {

at::Tensor compute(const at::Tensor& t) { return t.scalar_type() == at::kFloat ? t : t.to(at::kFloat); }

void Engine::Impl::end_backward(bool implicit_end) {
  try {
    reducer->end_backward();  // aborts itself if a collective fails
  } catch (...) {
    if (stage3) stage3->reset_after_error();
    throw;
  }
  if (stage3) stage3->after_backward(/*keep_awaited=*/implicit_end);
}

// A grad arrived from a backward the engine did not start (loss.backward()):
// begin one as engine.backward() would, and scale the grads on their way in
// by what engine.backward() scales the loss by. Its end is queued on every
// autograd graph task its grads arrive from (a reentrant checkpoint runs a
// nested one), and it ends when the last of them finishes. If autograd
// failed instead, the queued ends are destroyed unrun: the next grad or
// step() notices and drops what that backward left. fp16 is refused: its
// loss scale must apply before backward, or small grads underflow in the
// 16-bit cast before anything could scale them.
float Engine::Impl::implicit_backward() {
  if (reducer->in_implicit_backward() && implicit.alive.expired()) recover_if_backward_failed();
  if (!reducer->in_backward()) {
    if (config.fp16.enabled) {
      if (stage3) stage3->reset_after_error();  // its hooks may have begun this backward
      throw std::logic_error("zero::Engine: loss.backward() was called directly with fp16 enabled; fp16 needs the "
                             "loss scaled before backward: call engine.backward(loss) instead");
    }
    check_state();
    check_no_gathered_scope("backward (a plain loss.backward())");
    reducer->begin_backward(reduce_this_backward(), /*implicit=*/true);
    implicit = {};
  }
  const void* task = torch::autograd::get_current_graph_task_exec_info();
  if (std::find(implicit.tasks.begin(), implicit.tasks.end(), task) == implicit.tasks.end()) {
    std::shared_ptr<void> token = implicit.alive.lock();
    if (!token) implicit.alive = token = std::make_shared<int>(0);
    implicit.tasks.push_back(task);
    ++implicit.ends_pending;
    torch::autograd::Engine::get_default_engine().queue_callback([this, token] {
      if (--implicit.ends_pending == 0) end_backward(/*implicit_end=*/true);
    });
  }
  return static_cast<float>(1.0 / static_cast<double>(batch.gradient_accumulation_steps));
}

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
  m.check_state();
  m.check_no_gathered_scope("backward()");
  m.recover_if_backward_failed();
  const double gas = static_cast<double>(m.batch.gradient_accumulation_steps);
  m.reducer->begin_backward(m.reduce_this_backward());
  try {
    torch::autograd::backward({loss * (m.scaler.scale() / gas)});
  } catch (...) {
    // Issue no further collectives (the peers may not be in this backward);
    // drop the grads since the last step and the unit state, so the engine
    // stays usable.
    m.reducer->abort_backward();
    if (m.stage3) m.stage3->reset_after_error();
    throw;
  }
  m.end_backward();
  return loss.detach() / gas;
}

bool Engine::step() {
  impl_->check_state();
  impl_->check_no_gathered_scope("step()");
  impl_->recover_if_backward_failed();
  if (impl_->coalescing)
    throw std::logic_error("zero::Engine::step() inside coalesce_grad_reduction(): the grads are reduced when "
                           "the guard ends; leave its scope before stepping");
  if (impl_->no_sync && impl_->boundary())
    throw std::logic_error("zero::Engine::step() at the accumulation boundary inside no_sync(): the grads were "
                           "never reduced; leave the guard and run the boundary backward first");
  return impl_->step();
}

void Engine::set_gradient_accumulation_boundary(bool is_boundary) { impl_->boundary_override = is_boundary; }
void Engine::clear_gradient_accumulation_boundary() { impl_->boundary_override.reset(); }

Engine::NoSync::NoSync(Engine& e) : engine_(e) {
  auto& m = *e.impl_;
  if (m.stage >= 2)
    throw std::logic_error("zero::Engine::no_sync() is for stages 0 and 1: stage " + std::to_string(m.stage) +
                           " keeps only grad shards, so each backward must reduce (several backward calls "
                           "per step still work: each one reduces into the shard)");
  if (m.no_sync) throw std::logic_error("zero::Engine::no_sync() guards cannot be nested");
  if (m.coalescing)
    throw std::logic_error("zero::Engine::no_sync() inside coalesce_grad_reduction(): the guard already defers "
                           "the reduction; use one or the other");
  m.no_sync = true;
}

Engine::NoSync::~NoSync() { engine_.impl_->no_sync = false; }

Engine::CoalesceGradReduction::CoalesceGradReduction(Engine& e)
    : engine_(e), uncaught_at_entry_(std::uncaught_exceptions()) {
  auto& m = *e.impl_;
  if (m.stage == 0)
    throw std::logic_error("zero::Engine::coalesce_grad_reduction() is for stages 1-3: stage 0 all-reduces full "
                           "grads, so no_sync() already defers its reduction");
  if (m.coalescing) throw std::logic_error("zero::Engine::coalesce_grad_reduction() guards cannot be nested");
  if (m.no_sync)
    throw std::logic_error("zero::Engine::coalesce_grad_reduction() inside no_sync(): no_sync already defers "
                           "the reduction; use one or the other");
  m.coalescing = true;
}

Engine::CoalesceGradReduction::~CoalesceGradReduction() noexcept(false) {
  auto& m = *engine_.impl_;
  m.coalescing = false;
  // Unwinding: the peers may not reach a collective here; step() reduces
  // what is left unreduced instead.
  if (std::uncaught_exceptions() > uncaught_at_entry_) return;
  // Stage 1 reduces at the boundary only, as it would without the guard.
  if (m.stage >= 2 || m.boundary()) m.reducer->flush();
}
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

int64_t Engine::persistent_params() const {
  int64_t n = 0;
  for (size_t gi = 0; gi < impl_->groups.size(); ++gi)
    if (impl_->stage3 && impl_->stage3->persistent(gi)) n += impl_->groups[gi].layout.padded_numel;
  return n;
}

int64_t Engine::peak_live_params() const { return impl_->stage3 ? impl_->stage3->peak_live_in_forward() : 0; }

void Engine::reset_peak_live_params() {
  if (impl_->stage3) impl_->stage3->reset_peak();
}

std::map<std::string, at::Tensor> Engine::full_parameters() {
  auto& m = *impl_;
  std::map<std::string, at::Tensor> out;
  for (size_t gi = 0; gi < m.groups.size(); ++gi) {
    const bool gather = m.stage3 && !m.stage3->gathered(gi);
    if (m.stage3) m.stage3->gather(gi);  // also waits for a prefetch in flight
    const auto& g = m.groups[gi];
    for (size_t i = 0; i < g.params.size(); ++i) out[g.names[i]] = g.params[i].detach().to(at::kFloat).clone();
    if (gather) m.stage3->release(gi);
  }
  return out;
}

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
     << (m.init_note.empty() ? "" : "; " + m.init_note)
     << "; init flattened params in place, group by group (peak over the model: largest group, "
     << m.largest_group_bytes / (1 << 20) << " MiB)"
     << (m.sharded_at_init_units ? "; " + std::to_string(m.sharded_at_init_units) +
                                       " units were sharded at construction by zero::Init"
                                 : std::string());
  return os.str();
}

}  // namespace zero
