#include "zero/init.h"

#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include <ATen/core/grad_mode.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include "common/guard_device.h"
#include "engine/module_state.h"

#include "memory/device_memory.h"
#include "memory/page_buffer.h"
#include "memory/storage_release.h"
#include "partition/flat_group.h"
#include "zero/stage3.h"
#include "zero/stage_policy.h"
#include "zero/unit_runtime.h"

namespace zero {

namespace {
using detail::DeferredInit;
thread_local Init* g_active = nullptr;

// The units being built on this thread, innermost last, each with the
// inits its modules deferred (zero::defer_init) while it was.
struct UnitFrame {
  UnitBase* unit;
  std::vector<DeferredInit> deferred;
};
thread_local std::vector<UnitFrame> g_building;

// A module and what hangs below it (include_self would need it in its
// shared_ptr, which a module being built is not yet).
std::unordered_set<const torch::nn::Module*> subtree_of(const torch::nn::Module& m) {
  std::unordered_set<const torch::nn::Module*> s{&m};
  for (const auto& c : m.modules(/*include_self=*/false)) s.insert(c.get());
  return s;
}

// The unit, the module it wraps (whose children it adopted) and theirs.
std::unordered_set<const torch::nn::Module*> members_of(UnitBase& unit) {
  auto s = subtree_of(unit);
  s.insert(&unit.inner_module());
  return s;
}

bool deferral_allowed() {
  static const bool on = [] {
    const char* v = std::getenv("ZERO_INIT_DEFER");
    return !(v && std::string(v) == "off");
  }();
  return on;
}
}  // namespace

namespace detail {
BuildingUnit::BuildingUnit(UnitBase& unit) : unit_(&unit) { g_building.push_back({unit_, {}}); }

// A unit whose build threw still has its frame open: its deferred inits
// name modules that are gone.
BuildingUnit::~BuildingUnit() {
  if (!g_building.empty() && g_building.back().unit == unit_) g_building.pop_back();
}
}  // namespace detail

void defer_init(torch::nn::Module& module, std::function<void()> init) {
  if (g_active && !g_building.empty() && deferral_allowed()) {
    // Its tensors, held: a module found later at this address is this one
    // only if it still has them (a dropped module's address may be reused).
    std::vector<at::Tensor> tensors = module.parameters(/*recurse=*/true);
    for (const auto& b : module.buffers(/*recurse=*/true))
      if (b.defined()) tensors.push_back(b);
    if (!tensors.empty()) {  // (nothing to draw in place: no point deferring)
      g_building.back().deferred.push_back({&module, std::move(tensors), std::move(init)});
      return;
    }
  }
  at::NoGradGuard no_grad;
  init();
}

namespace detail {
void on_unit_constructed(UnitBase& unit) {
  UnitFrame frame{&unit, {}};  // a unit built without a frame (the Python front end's) defers nothing
  if (!g_building.empty() && g_building.back().unit == &unit) {
    frame = std::move(g_building.back());
    g_building.pop_back();
  }
  // Modules built before this unit's frame opened -- the arguments of
  // zero::Unit<X>(args...), built inside an enclosing unit -- filed their
  // inits with that unit: those of this unit's modules are this unit's,
  // and ran before its own.
  if (!g_building.empty()) {
    const auto members = members_of(unit);
    std::vector<DeferredInit> earlier;
    for (auto& enclosing : g_building) {
      auto& d = enclosing.deferred;
      for (auto it = d.begin(); it != d.end();) {
        if (members.count(it->module)) {
          earlier.push_back(std::move(*it));
          it = d.erase(it);
        } else {
          ++it;
        }
      }
    }
    frame.deferred.insert(frame.deferred.begin(), std::make_move_iterator(earlier.begin()),
                          std::make_move_iterator(earlier.end()));
  }
  if (g_active) {
    g_active->shard(unit, frame.deferred);
  } else {
    at::NoGradGuard no_grad;
    for (auto& d : frame.deferred) d.init();  // (the scope ended while the unit was built)
  }
}
}  // namespace detail

Init::Init(World& world, const Config& config, at::Device device)
    : Init(world.comm(), nullptr, world.group(), config, device) {}

Init::Init(comm::Comm& comm, std::shared_ptr<comm::Group> dp, const Config& config, at::Device device)
    : Init(comm, dp, dp ? *dp : throw std::invalid_argument("zero::Init: the data-parallel group is null"), config,
           device) {}

Init::Init(comm::Comm& comm, std::shared_ptr<comm::Group> owner, const comm::Group& dp, const Config& config,
           at::Device device)
    : comm_(comm), dp_owner_(std::move(owner)), dp_(dp), previous_(g_active), device_(device) {
  if (!comm_.serves(device_.type()))
    throw std::invalid_argument("zero::Init: units go to the CPU or a CUDA device, not " + device_.str() +
                                (device_.is_cuda() ? " (this zero-cpp was built without CUDA)" : ""));
  if (!device_.is_cpu() && !device_.has_index())  // "cuda": the current one, named now so every use agrees
    device_ = at::Device(device_.type(), c10::impl::VirtualGuardImpl(device_.type()).getDevice().index());
  // Below stage 3 params are whole on every rank anyway: the model is built
  // as without the scope (the engine syncs it from rank 0), so one program
  // switches stages by config alone.
  if (!StagePolicy::for_stage(config.zero.stage).shard_params) {
    inactive_ = true;
    return;
  }
  g_active = this;
  page_backed_ = std::make_shared<memory::PageBackedScope>();
}

// Seed 003: the unit is flattened on the device when it has room for the
// whole unit (its params copied in one by one, each host original freed as
// it goes), synced from rank 0 there and sharded; else in pinned host
// memory, synced over the host transports, and only the shard goes to the
// device. Either way neither side ever holds more than this one unit whole.
void Init::flatten_onto_device(partition::FlatGroup& g, const partition::InPlaceInit& init) {
  const int64_t bytes = g.layout.padded_numel * static_cast<int64_t>(sizeof(float));
  const auto free = memory::device_free_bytes(device_);
  // ZERO_INIT_DEVICE_FLATTEN=off takes the host path always (the bench's
  // baseline, and a test of that path on a GPU with room).
  static const bool device_flatten = [] {
    const char* v = std::getenv("ZERO_INIT_DEVICE_FLATTEN");
    return !(v && std::string(v) == "off");
  }();
  const bool room_here = device_flatten && free && *free > bytes + bytes / 8;  // headroom for the allocator's rounding
  // The ranks decide together: the flatten's broadcast runs on the device
  // or on the host, and a rank on the other side would pair it with nothing.
  // Any rank without room sends every rank through the host.
  at::Tensor without_room = at::full({1}, room_here ? 0 : 1, at::kInt);
  comm_.all_reduce(dp_, without_room, comm::ReduceOp::Sum, "zero::Init: units with no room on the device")->wait();
  const bool room = without_room.item<int>() == 0;
  partition::flatten_from_rank0(g, comm_, dp_, room ? device_ : at::Device(at::kCPU), /*pinned=*/!room, &init);
  // The shard straight into its own device buffer (one copy, no temporary).
  g.param_shard = at::empty({g.layout.shard_numel}, g.param_flat.options().device(device_).pinned_memory(false));
  g.param_shard.copy_(g.own_slot(g.param_flat, dp_.rank()));
  if (!room) {
    // The params view a device buffer that holds nothing yet (gathers fill
    // it): the whole unit never goes to the device. The pinned host one
    // goes with its last view.
    memory::released_flat(g.layout.padded_numel, at::kFloat, device_,
                          [&](const at::Tensor& flat) { partition::view_params_in(g, flat); });
  }
  ++(room ? units_flattened_on_device_ : units_flattened_on_host_);
}

Init::~Init() {
  if (inactive_) return;
  page_backed_.reset();
  g_active = previous_;
}

namespace {

// What the unit's modules deferred: the trainable params of their
// subtrees, drawn in place by their inits in the order they were deferred
// -- but for a param a module outside every deferring subtree holds too (a
// weight tied into a deferring module), whose value is copied as drawn at
// once, and which the init may still overwrite. Each deferring module must
// be one of the unit's, with the tensors it had when it deferred (else it
// was dropped, and its init would run on a module that is gone): named on
// every rank alike, as every rank builds the same model.
partition::InPlaceInit deferred_init_of(UnitBase& unit, const std::vector<DeferredInit>& deferred) {
  partition::InPlaceInit init;
  if (deferred.empty()) return init;
  const auto members = members_of(unit);
  std::unordered_set<const torch::nn::Module*> deferring;
  std::vector<std::function<void()>> runs;
  for (const auto& d : deferred) {
    const char* problem = nullptr;
    if (!members.count(d.module)) {
      problem = "is not registered in that unit (register it, or draw its params in its constructor)";
    } else {
      std::unordered_set<const void*> now;
      for (const auto& p : d.module->parameters(/*recurse=*/true)) now.insert(p.unsafeGetTensorImpl());
      for (const auto& b : d.module->buffers(/*recurse=*/true)) now.insert(b.unsafeGetTensorImpl());
      for (const auto& t : d.tensors)
        if (!now.count(t.unsafeGetTensorImpl()))
          problem = "was destroyed before the unit was built, or lost a param or buffer it had when it deferred "
                    "(a module that defers must live in the unit)";
    }
    if (problem)
      throw std::invalid_argument(std::string("zero::defer_init: a module built while a zero::Unit was being built "
                                              "deferred its init, but ") + problem);
    const auto below = subtree_of(*d.module);
    deferring.insert(below.begin(), below.end());
    for (const auto& p : d.module->parameters(/*recurse=*/true)) init.params.insert(p.unsafeGetTensorImpl());
    runs.push_back(d.init);
  }
  // The unit holds its wrapped module's own params (adopted): they follow that module.
  if (deferring.count(&unit.inner_module())) deferring.insert(&unit);
  for (const auto* m : members)
    if (!deferring.count(m))
      for (const auto& p : m->parameters(/*recurse=*/false)) init.params.erase(p.unsafeGetTensorImpl());
  init.run = [runs = std::move(runs)] {
    at::NoGradGuard no_grad;
    for (const auto& run : runs) run();
  };
  return init;
}

}  // namespace

void Init::shard(UnitBase& unit, const std::vector<DeferredInit>& deferred) {
  at::NoGradGuard no_grad;
  const c10::OptionalDeviceGuard on_device(guard_device(device_));
  // Ranks that build different units are named here, param and shapes,
  // not left to a flatten's broadcast of different sizes.
  check_same_model_on_all_ranks(unit, comm_, dp_,
                                "zero::Init: the ranks of " + dp_.describe() + " build different units (unit #" +
                                    std::to_string(units_sharded_ + 1) + " built under zero::Init; every rank must "
                                    "build the same model)");
  // Frozen params and buffers stay whole (replicated); all ranks take rank 0's.
  // Units nested in this one were sharded (and synced) when they were built:
  // only what none of them holds is this unit's.
  const auto own = detail::own_parameters(unit);
  std::vector<at::Tensor> replicated;
  for (const auto& [name, p] : own)
    if (!p.requires_grad()) replicated.push_back(p);
  for (const auto& b : detail::own_buffers(unit))
    if (b.defined()) replicated.push_back(b);
  const partition::InPlaceInit init = deferred_init_of(unit, deferred);
  // Frozen params and buffers go as the constructor left them (an init may
  // then set them where they live): small, and the same on every device.
  if (!device_.is_cpu())
    for (auto& t : replicated) t.set_data(t.to(device_));
  auto g = std::make_shared<partition::FlatGroup>();
  std::unordered_set<const void*> seen;
  std::vector<int64_t> numels, indices;
  for (const auto& [name, p] : own) {
    if (!p.requires_grad() || !seen.insert(p.unsafeGetTensorImpl()).second) continue;
    if (p.scalar_type() != at::kFloat)
      throw std::invalid_argument("zero::Init: unit params must be built in fp32, got " +
                                  std::string(c10::toString(p.scalar_type())));
    if (memory::pages_released(p) || memory::storage_released(p))
      throw std::invalid_argument("zero::Init: param '" + name + "' of this unit was already sharded by another "
                                  "unit (shared between units); build shared params outside zero::Init, where "
                                  "they belong to the root unit");
    indices.push_back(static_cast<int64_t>(g->params.size()));
    numels.push_back(p.numel());
    g->params.push_back(p);
  }
  // Rank 0's frozen params and buffers for every rank, once drawn (with
  // the trainable ones, in the flatten, if there are any).
  const auto sync_replicated = [&] {
    comm_.broadcast_coalesced(dp_, replicated, 0, "frozen params and buffers of a unit built under zero::Init");
    detail::UnitAccess::set_synced_at_init(unit);
  };
  if (g->params.empty()) {
    if (init.run) init.run();
    sync_replicated();
    return;
  }
  g->layout = partition::make_group_layout(numels, indices, dp_.size(), partition::kShardAlignElements);
  if (device_.is_cpu()) {
    partition::flatten_from_rank0(*g, comm_, dp_, std::nullopt, false, &init);
    // The shard lives in its own pages, so the unit's freed originals leave
    // reusable holes in the heap for the next unit instead of fragments.
    g->param_shard = memory::zeros_flat(g->layout.shard_numel, at::kFloat);
    g->param_shard.copy_(g->own_slot(g->param_flat, dp_.rank()));
  } else {
    flatten_onto_device(*g, init);
  }
  sync_replicated();
  // Until the engine adopts the unit (and names its params in full), an
  // access to a released param names it relative to its unit.
  std::vector<memory::NamedRange> ranges;
  const size_t elem = g->param_flat.element_size();
  size_t k = 0;
  std::unordered_set<const void*> named;
  for (const auto& [name, p] : own) {
    if (!p.requires_grad() || !named.insert(p.unsafeGetTensorImpl()).second) continue;
    const auto& slot = g->layout.params[k++];
    ranges.push_back({static_cast<size_t>(slot.offset) * elem, static_cast<size_t>(slot.numel) * elem,
                      "stage 3: param '" + name + "' of a unit built under zero::Init"});
  }
  memory::name_released_contents(g->param_flat, std::move(ranges),
                                 "between uses only this rank's shard of it exists; pass the model to its "
                                 "zero::Engine and read full params inside engine.gathered_parameters(...)");
  partition::release_params(*g);
  detail::UnitAccess::set_sharded_at_init(unit, std::move(g));
  ++units_sharded_;
}

}  // namespace zero
