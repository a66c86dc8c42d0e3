// zero_cpp._C: the Python front end's view of the C++ engine. Thin: each
// binding hands Python's tensors (the same TensorImpls) to the library and
// its results back; the Python package (python/zero_cpp/) gives it
// DeepSpeed's API. Calls that may wait on the other ranks (collectives,
// backward, step, gathers) release the GIL, so other Python threads run
// and autograd's own threads may take it (a Python autograd Function in
// the model).
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "ckpt/checkpoint_dir.h"
#include "ckpt/manifest.h"
#include "ckpt/safetensors.h"
#include "comm/comm_log.h"
#include "common/libstdcxx_binding.h"
#include "memory/page_buffer.h"
#include "memory/release_guard.h"
#include "memory/storage_release.h"
#include "optim/lr_schedule.h"
#include "partition/flat_group.h"
#include "python/module_mirror.h"
#include "zero/comm.h"
#include "zero/comm_counters.h"
#include "zero/config.h"
#include "zero/engine.h"
#include "zero/init.h"
#include "zero/stage3.h"
#include "zero/unit_runtime.h"

namespace py = pybind11;

namespace zero::python {

namespace {

using Release = py::call_guard<py::gil_scoped_release>;

// The module a Python mirror object holds (ModuleMirror or UnitMirror).
std::shared_ptr<torch::nn::Module> module_of(const py::handle& obj) {
  if (py::isinstance<ModuleMirror>(obj)) return obj.cast<std::shared_ptr<ModuleMirror>>();
  if (py::isinstance<UnitMirror>(obj)) return obj.cast<std::shared_ptr<UnitMirror>>();
  throw py::type_error("zero_cpp._C: expected a ModuleMirror or UnitMirror, got " +
                       std::string(py::str(py::type::handle_of(obj))));
}

// An engine over a mirrored Python model, with the guards DeepSpeed's
// context managers open and close (each at most one at a time, as the
// engine allows).
class PyEngine {
 public:
  PyEngine(std::shared_ptr<World> world, std::shared_ptr<ModuleMirror> root, const std::string& config_json,
           const std::vector<std::pair<std::vector<at::Tensor>, std::pair<double, double>>>& groups)
      : world_(std::move(world)), root_(std::move(root)) {
    std::vector<ParamGroup> param_groups;
    for (const auto& [params, hyper] : groups) param_groups.push_back({params, hyper.first, hyper.second});
    engine_ = std::make_unique<Engine>(*root_, Config::from_string(config_json), *world_, std::move(param_groups));
  }

  Engine& engine() { return *engine_; }

  // DeepSpeed's engine(*args): `fn` runs the module and returns the
  // tensors of its result (its structure stays in Python).
  void forward(const py::function& fn) {
    engine_->forward_each([&] { return fn().cast<std::vector<at::Tensor>>(); });
  }

  void begin_no_sync() {
    if (no_sync_) throw std::logic_error("zero_cpp: no_sync() contexts cannot be nested");
    no_sync_.emplace(*engine_);
  }
  void end_no_sync() { no_sync_.reset(); }

  void begin_coalesce() {
    if (coalesce_) throw std::logic_error("zero_cpp: coalesce_grad_reduction() contexts cannot be nested");
    coalesce_.emplace(*engine_);
  }
  // ok: the with-block finished normally (reduce now, a collective); else
  // it raised: end without a collective (step() reduces what is left).
  void end_coalesce(bool ok) {
    if (!coalesce_) return;
    struct Reset {
      std::optional<Engine::CoalesceGradReduction>& g;
      ~Reset() { g.reset(); }
    } reset{coalesce_};
    if (ok) coalesce_->finish();
    else coalesce_->abandon();
  }

 private:
  std::shared_ptr<World> world_;
  std::shared_ptr<ModuleMirror> root_;  // the engine refers into it
  std::unique_ptr<Engine> engine_;
  std::optional<Engine::NoSync> no_sync_;
  std::optional<Engine::CoalesceGradReduction> coalesce_;
};

// One GatheredParameters scope, finished (ok) or abandoned by Python's
// context manager.
class PyGathered {
 public:
  PyGathered(std::shared_ptr<PyEngine> engine, std::vector<at::Tensor> params, std::optional<int> modifier_rank)
      : engine_(std::move(engine)) {
    guard_.emplace(engine_->engine(), std::move(params), modifier_rank);
  }
  void end(bool ok) {
    if (!guard_) return;
    struct Reset {
      std::optional<Engine::GatheredParameters>& g;
      ~Reset() { g.reset(); }
    } reset{guard_};
    if (ok) guard_->finish();
    else guard_->abandon();
  }

 private:
  std::shared_ptr<PyEngine> engine_;
  std::optional<Engine::GatheredParameters> guard_;
};

// A zero::Init scope (seed 003): while it lives, shard(unit) shards a unit
// the moment its Python module is built.
class PyInit {
 public:
  PyInit(std::shared_ptr<World> world, const std::string& config_json, const std::string& device)
      : world_(std::move(world)) {
    init_ = std::make_unique<Init>(*world_, Config::from_string(config_json), at::Device(device));
  }
  void shard(UnitMirror& unit) { detail::on_unit_constructed(unit); }
  int64_t units_sharded() const { return init_ ? init_->units_sharded() : 0; }
  void close() { init_.reset(); }

 private:
  std::shared_ptr<World> world_;
  std::unique_ptr<Init> init_;
};

// Runs fn on the group zero.Init sharded `u` into (nothing if none), which
// stays the unit's for the engine to adopt, whatever fn does.
template <typename Fn>
void with_init_group(UnitMirror& u, Fn&& fn) {
  auto g = detail::UnitAccess::take_sharded_at_init(u);
  if (!g) return;
  struct PutBack {
    UnitMirror& u;
    std::shared_ptr<partition::FlatGroup>& g;
    ~PutBack() { detail::UnitAccess::set_sharded_at_init(u, std::move(g)); }
  } put_back{u, g};
  fn(*g);
}

py::dict counts(const comm::OpCounts& ops) {
  py::dict out;
  for (const auto& [op, c] : ops) {
    py::dict d;
    d["calls"] = c.calls;
    d["bytes"] = c.bytes;
    d["calls_by_transport"] = c.calls_by_transport;
    out[py::str(op)] = d;
  }
  return out;
}

// Every param of a checkpoint whole, in fp32, by name; frozen params and
// buffers as saved; and what the run stored beside them.
py::dict read_checkpoint(const std::string& dir, const std::string& tag) {
  ckpt::CheckpointReader reader(dir, tag);
  const auto& m = reader.manifest();
  py::dict params, replicated;
  for (const auto& p : m.params) {
    at::Tensor t = at::empty(p.shape, at::kFloat);
    reader.read(p.name, "master", 0, p.numel, t.data_ptr<float>());
    params[py::str(p.name)] = t;
  }
  for (const auto& r : m.replicated) {
    const char* data = reader.replicated_data(r.name);
    int64_t numel = 1;
    for (int64_t d : r.shape) numel *= d;
    const int64_t bytes = numel * ckpt::dtype_size(r.dtype);
    // The safetensors dtype names torch's: one byte buffer viewed as it.
    static const std::map<std::string, at::ScalarType> kinds = {
        {"F32", at::kFloat}, {"F64", at::kDouble}, {"F16", at::kHalf}, {"BF16", at::kBFloat16}, {"I64", at::kLong},
        {"I32", at::kInt},   {"I16", at::kShort},  {"I8", at::kChar},  {"U8", at::kByte},       {"BOOL", at::kBool}};
    auto kind = kinds.find(r.dtype);
    if (kind == kinds.end()) throw std::runtime_error("checkpoint: buffer '" + r.name + "' has dtype " + r.dtype);
    at::Tensor t = at::empty(r.shape, kind->second);
    std::memcpy(t.data_ptr(), data, static_cast<size_t>(bytes));
    replicated[py::str(r.name)] = t;
  }
  py::dict out;
  out["path"] = reader.path();
  out["params"] = params;
  out["replicated"] = replicated;
  out["client_state"] = m.client_state.dump();
  out["engine_state"] = m.engine_state.dump();
  out["stage"] = m.stage;
  out["world_size"] = m.world_size;
  return out;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  // A released param read from Python: the stop message names the Python
  // API after the C++ engine's advice.
  memory::set_released_access_note(
      "From Python (zero_cpp): read or change full params inside deepspeed.zero.GatheredParameters(params), "
      "and .clone() what you keep from it (a view such as p.data is released with the param); "
      "take the whole model with engine.consolidated_fp32_state_dict() or engine.save_16bit_model(dir); call "
      "the model as engine(x) or engine.module(x).");
  m.doc() = "zero-cpp's C++ engine, for the zero_cpp package (DeepSpeed's API over it)";

  // ---- the job ----
  py::class_<World, std::shared_ptr<World>>(m, "World")
      .def_property_readonly("rank", &World::rank)
      .def_property_readonly("size", &World::size)
      .def_property_readonly("local_rank", [](const World& w) { return w.env().local_rank; })
      .def_property_readonly("local_world_size", [](const World& w) { return w.env().local_world_size; })
      .def_property_readonly("launcher", [](const World& w) { return w.env().launcher; })
      .def_property_readonly("device", [](const World& w) { return w.device().str(); })
      .def("shutdown", &World::shutdown, Release())
      .def_property_readonly("is_shut_down", &World::is_shut_down);
  m.def(
      "init_distributed",
      [](bool join_existing_store) {
        comm::DistributedOptions o;
        o.join_existing_store = join_existing_store;
        return init_distributed(o);
      },
      py::arg("join_existing_store"), Release());
  m.def("launch_env", [] {
    const comm::LaunchEnv e = comm::read_launch_env();
    py::dict d;
    d["launcher"] = e.launcher;
    d["rank"] = e.rank;
    d["world_size"] = e.world_size;
    d["local_rank"] = e.local_rank;
    d["local_world_size"] = e.local_world_size;
    d["master_addr"] = e.master_addr;
    d["master_port"] = e.master_port;
    d["job_id"] = e.job_id;
    return d;
  });
  m.def("std_filesystem_binding_warning", &std_filesystem_binding_warning);
  // Whether `t` (a stage-3 param, or a tensor sharing its storage) lies in a
  // released buffer now: reading it would stop the process.
  m.def("released", [](const at::Tensor& t) {
    return t.defined() && t.numel() > 0 && (memory::pages_released(t) || memory::storage_released(t));
  });

  // ---- config ----
  // The parsed config back as JSON (every key resolved), or a ValueError
  // naming what is wrong.
  // For checkpoints written from Python (zero_cpp.deepspeed_checkpoint): the
  // loader's own hashes, so writer and reader cannot drift apart.
  m.def("checkpoint_manifest_hash",
        [](const std::string& text) { return std::to_string(ckpt::manifest_hash(nlohmann::json::parse(text))); });
  m.def(
      "checkpoint_file_digest",
      [](const std::string& path) {
        ckpt::SafetensorsFile f(path);
        return std::make_pair(f.file_bytes(), std::to_string(f.hash()));
      },
      Release());
  // DeepSpeed's comms_logger: the dispatcher's log of each collective (comm/comm_log.h).
  m.def("comms_log_enable", [](bool on) { comm::comm_log::set_enabled(on); });
  m.def("comms_log_drain", [] {
    std::vector<std::tuple<std::string, int64_t, int, double>> out;
    for (auto& r : comm::comm_log::drain()) out.emplace_back(std::move(r.op), r.message_bytes, r.group_size, r.ms);
    return out;
  });
  m.def("parse_config", [](const std::string& text) { return Config::from_string(text).to_json().dump(); });
  // A config scheduler's lr at `iteration` for a group whose own lr is
  // `base_lr` (DeepSpeed's schedulers act per group: WarmupLR without
  // warmup_max_lr rises to each group's lr).
  m.def("scheduled_lr", [](const std::string& text, double base_lr, int64_t iteration) {
    SchedulerConfig s = Config::from_string(text).scheduler;
    if (s.warmup_max_lr_follows_optimizer) s.warmup_max_lr = base_lr;
    return optim::scheduled_lr(s, base_lr, iteration);
  });
  // OneCycle with cycle_momentum: Adam's (beta1, beta2) at `iteration`; None for any other schedule.
  m.def("scheduled_betas", [](const std::string& text, int64_t iteration) {
    return optim::scheduled_betas(Config::from_string(text).scheduler, iteration);
  });
  m.def("resolve_batch", [](const std::string& text, int dp_size) {
    const BatchConfig b = Config::from_string(text).resolve_batch(dp_size);
    return std::make_tuple(b.train_batch_size, b.micro_batch_per_gpu, b.gradient_accumulation_steps);
  });

  // ---- the mirrored model ----
  py::class_<ModuleMirror, std::shared_ptr<ModuleMirror>>(m, "ModuleMirror")
      .def(py::init<const std::string&>())
      .def("set_members", &ModuleMirror::set_members)
      .def("add_child", [](ModuleMirror& self, const std::string& name, const py::object& child) {
        self.add_child(name, module_of(child));
      });
  py::class_<UnitMirror, std::shared_ptr<UnitMirror>>(m, "UnitMirror")
      .def(py::init([] { return std::make_shared<UnitMirror>(); }))
      .def("set_members", &UnitMirror::set_members)
      .def("add_child", [](UnitMirror& self, const std::string& name, const py::object& child) {
        self.add_child(name, module_of(child));
      })
      .def("enter", &UnitMirror::enter, Release())
      .def("leave", &UnitMirror::leave, Release())
      .def("failed", &UnitMirror::failed, Release())
      .def_property_readonly("sharded_at_init",
                             [](UnitMirror& u) { return detail::UnitAccess::synced_at_init(u); })
      // A module zero.Init sharded that turns out to be the model's root
      // (the root is no unit): its params gathered back whole, in place, on
      // every rank (a collective).
      .def(
          "gather_back",
          [](UnitMirror& u, World& world) {
            if (auto g = detail::UnitAccess::take_sharded_at_init(u))
              gather_params(*g, world.comm(), world.group(), "params of the root, sharded by zero.Init");
          },
          Release());

  // GatheredParameters over a module zero.Init sharded, before any engine
  // holds it: its whole params back (a collective), and after the block
  // released again, this rank's shard taking what was written into them
  // when `keep_changes` (modifier_rank's values, broadcast by then).
  m.def(
      "gather_init_unit",
      [](UnitMirror& u, World& world) {
        with_init_group(u, [&](partition::FlatGroup& g) {
          gather_params(g, world.comm(), world.group(), "params of a module zero.Init sharded (GatheredParameters)");
        });
      },
      Release());
  m.def(
      "release_init_unit",
      [](UnitMirror& u, World& world, bool keep_changes) {
        with_init_group(u, [&](partition::FlatGroup& g) {
          at::NoGradGuard no_grad;
          if (keep_changes) g.param_shard.copy_(g.own_slot(g.param_flat, world.group().rank()));
          partition::release_params(g);
        });
      },
      Release());

  py::class_<PyInit>(m, "Init")
      .def(py::init<std::shared_ptr<World>, const std::string&, const std::string&>(), Release())
      .def("shard", &PyInit::shard, Release())
      .def_property_readonly("units_sharded", &PyInit::units_sharded)
      .def("close", &PyInit::close);

  // ---- the engine ----
  py::class_<PyEngine, std::shared_ptr<PyEngine>>(m, "Engine")
      .def(py::init<std::shared_ptr<World>, std::shared_ptr<ModuleMirror>, const std::string&,
                    const std::vector<std::pair<std::vector<at::Tensor>, std::pair<double, double>>>&>(),
           Release())
      .def("forward", &PyEngine::forward)
      .def("backward", [](PyEngine& e, const at::Tensor& loss) { return e.engine().backward(loss); }, Release())
      .def("scale", [](PyEngine& e, const at::Tensor& loss) { return e.engine().scale(loss); })
      .def("step", [](PyEngine& e) { return e.engine().step(); }, Release())
      .def("zero_grad", [](PyEngine& e) { e.engine().zero_grad(); }, Release())
      .def("is_gradient_accumulation_boundary",
           [](PyEngine& e) { return e.engine().is_gradient_accumulation_boundary(); })
      .def("set_gradient_accumulation_boundary",
           [](PyEngine& e, std::optional<bool> b) {
             if (b) e.engine().set_gradient_accumulation_boundary(*b);
             else e.engine().clear_gradient_accumulation_boundary();
           })
      .def("begin_no_sync", &PyEngine::begin_no_sync)
      .def("end_no_sync", &PyEngine::end_no_sync)
      .def("begin_coalesce", &PyEngine::begin_coalesce)
      .def("end_coalesce", &PyEngine::end_coalesce, Release())
      .def("set_param_group_lrs", [](PyEngine& e, std::vector<double> lrs) { e.engine().set_param_group_lrs(lrs); })
      .def("set_param_group_weight_decays",
           [](PyEngine& e, std::vector<double> wds) { e.engine().set_param_group_weight_decays(wds); })
      .def_property_readonly("global_steps", [](PyEngine& e) { return e.engine().global_steps(); })
      .def_property_readonly("skipped_steps", [](PyEngine& e) { return e.engine().skipped_steps(); })
      .def_property_readonly("micro_steps", [](PyEngine& e) { return e.engine().micro_steps(); })
      .def_property_readonly("loss_scale", [](PyEngine& e) { return e.engine().loss_scale(); })
      .def_property_readonly("lr", [](PyEngine& e) { return e.engine().lr(); })
      .def_property_readonly("last_grad_norm", [](PyEngine& e) { return e.engine().last_grad_norm(); })
      .def("last_step_times", [](PyEngine& e) { return e.engine().last_step_times(); })
      .def_property_readonly("compute_dtype",
                             [](PyEngine& e) { return std::string(c10::toString(e.engine().compute_dtype())); })
      .def("set_batch",
           [](PyEngine& e, int64_t micro, int64_t gas) { e.engine().set_batch(micro, gas); })
      .def_property_readonly("batch",
                             [](PyEngine& e) {
                               const auto& b = e.engine().batch();
                               return std::make_tuple(b.train_batch_size, b.micro_batch_per_gpu,
                                                      b.gradient_accumulation_steps);
                             })
      .def("offload_states",
           [](PyEngine& e, std::vector<std::string> include, bool pin_memory) {
             return e.engine().offload_states(include, pin_memory);
           },
           Release())
      .def("reload_states", [](PyEngine& e) { e.engine().reload_states(); }, Release())
      .def_property_readonly("states_offloaded", [](PyEngine& e) { return e.engine().states_offloaded(); })
      .def_property_readonly("num_params", [](PyEngine& e) { return e.engine().num_params(); })
      .def("state_bytes",
           [](PyEngine& e) {
             const StateBytes b = e.engine().state_bytes();
             return std::map<std::string, int64_t>{{"params", b.params}, {"grads", b.grads}, {"master", b.master},
                                                   {"optimizer", b.optimizer}, {"nvme", b.nvme}};
           })
      .def("describe", [](PyEngine& e) { return e.engine().describe(); })
      .def("peak_live_params", [](PyEngine& e) { return e.engine().peak_live_params(); })
      .def("persistent_params", [](PyEngine& e) { return e.engine().persistent_params(); })
      .def("comm_counts", [](PyEngine& e) { return counts(e.engine().comm().counters().totals()); })
      .def("comm_counts_of_group",
           [](PyEngine& e) { return counts(e.engine().comm().counters().for_group(e.engine().dp_group().name())); })
      .def("global_mean", [](PyEngine& e, double v) { return e.engine().global_mean(v); }, Release())
      // Every rank's `mine` (as many on each), rank by rank, through the
      // engine's own collectives: a call only some ranks make is named by the
      // shared-memory lanes (a stall or a disagreement) within seconds, where
      // torch.distributed's would wait for its timeout.
      .def(
          "all_gather_ints",
          [](PyEngine& e, const std::vector<int64_t>& mine, const std::string& label) {
            auto& eng = e.engine();
            const comm::Group& g = eng.dp_group();
            const at::Tensor in = at::tensor(mine, at::kLong);
            at::Tensor out = at::empty({in.numel() * g.size()}, at::kLong);
            eng.comm().all_gather(g, out, in, label)->wait();
            return std::vector<int64_t>(out.data_ptr<int64_t>(), out.data_ptr<int64_t>() + out.numel());
          },
          Release())
      .def("state_dict", [](PyEngine& e, bool rank0_only) { return e.engine().state_dict(rank0_only); },
           py::arg("rank0_only") = false, Release())
      .def("full_parameters", [](PyEngine& e) { return e.engine().full_parameters(); }, Release())
      .def(
          "full_state",
          [](PyEngine& e, const std::string& kind, const std::string& name) { return e.engine().full_state(kind, name); },
          Release())
      .def("local_range", [](PyEngine& e, const std::string& name) { return e.engine().local_range(name); })
      .def("local_param",
           [](PyEngine& e, const std::string& name) -> std::optional<at::Tensor> {
             at::Tensor t = e.engine().local_param(name);
             if (!t.defined()) return std::nullopt;
             return t;
           })
      .def(
          "local_state",
          [](PyEngine& e, const std::string& kind, const std::string& name) { return e.engine().local_state(kind, name); },
          Release())
      .def(
          "set_state",
          [](PyEngine& e, const std::string& kind, const std::string& name, const at::Tensor& value, bool local) {
            e.engine().set_state(kind, name, value, local);
          },
          Release())
      .def("save_weights", [](PyEngine& e, const std::string& path) { e.engine().save_weights(path); }, Release())
      .def("load_weights", [](PyEngine& e, const std::string& path) { e.engine().load_weights(path); }, Release())
      .def(
          "save_checkpoint",
          [](PyEngine& e, const std::string& dir, const std::string& tag, const std::string& client_json,
             bool exclude_frozen_params) {
            e.engine().save_checkpoint(dir, tag, nlohmann::json::parse(client_json), {exclude_frozen_params});
          },
          py::arg("dir"), py::arg("tag"), py::arg("client_json"), py::arg("exclude_frozen_params") = false, Release())
      .def(
          "load_checkpoint",
          [](PyEngine& e, const std::string& dir, const std::string& tag, bool optimizer_state, bool step_counters,
             bool strict) {
            return e.engine().load_checkpoint(dir, tag, {optimizer_state, step_counters, strict}).dump();
          },
          py::arg("dir"), py::arg("tag"), py::arg("optimizer_state"), py::arg("step_counters"),
          py::arg("strict") = true,
          Release());

  py::class_<PyGathered>(m, "GatheredParameters")
      .def(py::init<std::shared_ptr<PyEngine>, std::vector<at::Tensor>, std::optional<int>>(), Release())
      .def("end", &PyGathered::end, Release());

  // ---- checkpoints, without an engine ----
  m.def("read_checkpoint", &read_checkpoint, py::arg("dir"), py::arg("tag") = "");
  m.def("consolidate", &ckpt::consolidate, py::arg("dir"), py::arg("tag"), py::arg("out"), py::arg("dtype"),
        Release());
  m.def("resolve_tag", &ckpt::resolve_tag);
}

}  // namespace zero::python
