#include "engine/checkpoint.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <system_error>
#include <tuple>
#include <unordered_map>

#include <unistd.h>

#include <ATen/core/grad_mode.h>

#include "ckpt/checkpoint_dir.h"
#include "common/fault_injection.h"

namespace zero {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Reads elements [begin, end) of a param's state `kind` into `out` (fp32).
using RangeReader = std::function<void(const std::string& name, const std::string& kind, int64_t begin,
                                       int64_t end, float* out)>;

// A piece of one param held by one rank's master: the layout's fragment,
// with the param's name.
struct Piece {
  const std::string& name;
  partition::Fragment where;  // param_offset, shard_offset (into the master), numel
};

// What `rank`'s master holds of group g: its shard's fragments, or (an
// unsharded optimizer) every param whole.
std::vector<Piece> pieces(const CheckpointTarget& t, const partition::FlatGroup& g, int rank) {
  std::vector<Piece> out;
  if (!t.policy.shard_optimizer_state) {
    for (size_t i = 0; i < g.params.size(); ++i) {
      const auto& slot = g.layout.params[i];
      out.push_back({g.names[i], {slot.param_index, 0, slot.offset, slot.numel}});
    }
    return out;
  }
  std::unordered_map<int64_t, size_t> position;  // param_index -> place in the group
  for (size_t i = 0; i < g.params.size(); ++i) position[g.layout.params[i].param_index] = i;
  for (const auto& f : g.layout.fragments(rank)) out.push_back({g.names[position.at(f.param_index)], f});
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> state_kinds(const partition::FlatGroup& g) {
  std::vector<std::pair<std::string, at::Tensor>> k{{"master", g.master}};
  if (g.exp_avg.defined()) k.emplace_back("exp_avg", g.exp_avg);
  if (g.exp_avg_sq.defined()) k.emplace_back("exp_avg_sq", g.exp_avg_sq);
  return k;
}

// The dtype a frozen param or buffer is saved in: floating-point ones at
// least fp32 (a 16-bit one widened, which is exact), since the module holds
// them in the compute dtype and that may differ where the checkpoint is
// loaded (zero_cpp.compute_dtype "auto" picks per machine); others as they are.
at::ScalarType saved_dtype(const at::Tensor& t) {
  return t.is_floating_point() && t.element_size() < 4 ? at::kFloat : t.scalar_type();
}

// A frozen param or buffer saved as `dtype` loads into the module's tensor
// when both are floating point (converted: widened, or rounded to the
// module's dtype) or both are the same dtype; anything else names both.
void check_replicated_dtype(const ReplicatedTensor& r, const std::string& dtype, const std::string& where) {
  const at::ScalarType saved = scalar_type_of(dtype), model = r.tensor.scalar_type();
  if (saved == model || (at::isFloatingType(saved) && at::isFloatingType(model))) return;
  throw std::runtime_error(where + ": " + r.name + " is " + dtype + ", the model's is " + c10::toString(model) +
                           " (only floating-point dtypes convert)");
}

// Copies a frozen param or buffer stored as `dtype` bytes into the module's
// tensor, converting floating-point dtypes (check_replicated_dtype first).
void copy_replicated(const ReplicatedTensor& r, const std::string& dtype, const char* data) {
  at::NoGradGuard no_grad;
  auto src = at::from_blob(const_cast<char*>(data), r.tensor.sizes(), at::TensorOptions().dtype(scalar_type_of(dtype)));
  r.tensor.copy_(src);
}

std::string shape_string(at::IntArrayRef s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Model params (name -> shape) in registration order, from the layouts.
std::vector<std::pair<std::string, std::vector<int64_t>>> model_params(const CheckpointTarget& m) {
  std::vector<std::tuple<int64_t, std::string, std::vector<int64_t>>> all;
  for (const auto& g : m.groups)
    for (size_t i = 0; i < g.params.size(); ++i)
      all.emplace_back(g.layout.params[i].param_index, g.names[i], g.params[i].sizes().vec());
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (auto& [idx, name, shape] : all) out.emplace_back(name, shape);
  return out;
}

// Frozen params and buffers (name -> shape).
std::vector<std::pair<std::string, std::vector<int64_t>>> model_replicated(const CheckpointTarget& m) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& r : m.replicated) out.emplace_back(r.name, r.tensor.sizes().vec());
  return out;
}

// Fills each group's state on this rank from `read`, param range by range.
void fill_state(CheckpointTarget& m, const RangeReader& read, bool master_only) {
  at::NoGradGuard no_grad;
  for (auto& g : m.groups) {
    auto state = m.optimizer.resident(g, /*write=*/true);  // NVMe offload: paged in, written back
    const auto mine = pieces(m, g, m.dp.rank());
    for (auto& [kind, t] : state_kinds(g)) {
      if (master_only && kind != "master") continue;
      // Files are read on the host; device state is staged there and copied once.
      at::Tensor host = t.is_cpu() ? t : t.to(at::kCPU);
      for (const auto& [name, f] : mine)
        read(name, kind, f.param_offset, f.param_offset + f.numel, host.data_ptr<float>() + f.shard_offset);
      if (!host.is_same(t)) t.copy_(host);
    }
    state.done();
  }
}

json engine_state(const CheckpointTarget& m) {
  json j = m.optimizer.state();
  j["micro_steps"] = m.micro_steps;
  j["batch"] = {{"train_batch_size", m.batch.train_batch_size},
                {"micro_batch_per_gpu", m.batch.micro_batch_per_gpu},
                {"gradient_accumulation_steps", m.batch.gradient_accumulation_steps}};
  return j;
}

// The optimizer whose state a checkpoint holds ("" if it does not say).
std::string saved_optimizer(const ckpt::Manifest& man) {
  if (man.engine_state.contains("optimizer")) return man.engine_state.at("optimizer");
  if (man.config.contains("optimizer")) return man.config.at("optimizer").value("type", "");
  return "";
}

// Adam and AdamW keep the same state (two moments); every other type's is
// its own, even where the buffer's name is shared (Lion's exp_avg is not
// SGD's momentum nor Adam's first moment).
bool same_optimizer_state(const std::string& a, OptimizerType b) {
  const auto family = [](const std::string& t) { return t == "Adam" || t == "AdamW" ? std::string("Adam") : t; };
  return a.empty() || family(a) == family(to_string(b));
}

// How the checkpoint's run batched: recorded since this field exists, else
// derived from its config and data-parallel size.
BatchConfig saved_batch(const ckpt::Manifest& man) {
  if (man.engine_state.contains("batch")) {
    const auto& b = man.engine_state.at("batch");
    return {b.at("train_batch_size"), b.at("micro_batch_per_gpu"), b.at("gradient_accumulation_steps")};
  }
  return Config::from_json(man.config).resolve_batch(man.dp_size);
}

// One line, when the run resumes with another shape than it was saved with.
std::string describe_resume_change(const ckpt::Manifest& man, const CheckpointTarget& m) {
  const BatchConfig was = saved_batch(man), now = m.batch;
  if (man.dp_size == m.dp.size() && was.micro_batch_per_gpu == now.micro_batch_per_gpu &&
      was.gradient_accumulation_steps == now.gradient_accumulation_steps)
    return {};
  auto ranks = [](int n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); };
  auto shape = [](const BatchConfig& b) {
    return std::to_string(b.gradient_accumulation_steps) + " micro-batches of " +
           std::to_string(b.micro_batch_per_gpu) + " per step";
  };
  std::string line = "load_checkpoint: resuming at step " + std::to_string(man.engine_state.value("global_steps", 0)) +
                     " with " + ranks(m.dp.size()) + " x " + shape(now) + " (saved with " + ranks(man.dp_size) +
                     " x " + shape(was) + "); global batch ";
  line += was.train_batch_size == now.train_batch_size
              ? std::to_string(now.train_batch_size) + " unchanged"
              : std::to_string(was.train_batch_size) + " -> " + std::to_string(now.train_batch_size);
  return line;
}

void restore_engine_state(CheckpointTarget& m, const json& j, bool optimizer_state, bool step_counters) {
  if (!step_counters && !optimizer_state) return;
  if (optimizer_state && step_counters) m.optimizer.restore(j);
  else if (step_counters) m.optimizer.restore_counters(j);
  else m.optimizer.restore_update_state(j);
  // A checkpoint is saved at a step boundary: the count of micro-steps is
  // rebuilt with this run's accumulation steps, so the next boundary falls
  // where this run's batching puts it (another world size at a fixed
  // train_batch_size changes the accumulation count).
  m.micro_steps =
      (m.optimizer.global_steps() + m.optimizer.skipped_steps()) * m.batch.gradient_accumulation_steps;
}

// Names the first difference between the model's params and a file's.
void check_same_params(const std::vector<std::pair<std::string, std::vector<int64_t>>>& model,
                       const std::function<const std::vector<int64_t>*(const std::string&)>& shape_in_file,
                       const std::vector<std::string>& file_names, const std::string& where) {
  std::set<std::string> in_model;
  for (const auto& [name, shape] : model) {
    in_model.insert(name);
    const auto* s = shape_in_file(name);
    if (!s) throw std::runtime_error(where + " has no param " + name + ": it was saved from a different model");
    if (*s != shape)
      throw std::runtime_error(where + ": param " + name + " has shape " + shape_string(*s) + ", the model's is " +
                               shape_string(shape) + ": it was saved from a different model");
  }
  for (const auto& n : file_names)
    if (!in_model.count(n))
      throw std::runtime_error(where + " has param " + n + ", which the model does not: it was saved from a different model");
}


// Not strict: the entries of `model` the file has, and the file's names the
// model has -- what check_same_params then holds to the same shapes.
void keep_common(std::vector<std::pair<std::string, std::vector<int64_t>>>& model, std::vector<std::string>& file_names,
                 const std::function<const std::vector<int64_t>*(const std::string&)>& shape_in_file) {
  std::set<std::string> in_model;
  for (const auto& [name, shape] : model) in_model.insert(name);
  model.erase(std::remove_if(model.begin(), model.end(), [&](const auto& e) { return !shape_in_file(e.first); }),
              model.end());
  file_names.erase(std::remove_if(file_names.begin(), file_names.end(),
                                  [&](const std::string& n) { return !in_model.count(n); }),
                   file_names.end());
}

// The launcher's name for this host (zero-run sets ZERO_HOST_NAME), else the system's.
std::string this_host_name() {
  if (const char* v = std::getenv("ZERO_HOST_NAME"); v && *v) return v;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "unknown";
  return name;
}

}  // namespace

std::string agree(comm::Comm& comm, const comm::Group& dp, const std::string& what, const std::string& error,
                  const bool* wrote_state, std::string* state_lost) {
  const int n = dp.size();
  // What the other ranks are told: this rank's host, then its error.
  const std::string text = this_host_name() + '\n' + error.substr(0, 4000);
  auto mine = at::tensor({static_cast<int64_t>(!error.empty()), static_cast<int64_t>(wrote_state && *wrote_state),
                          static_cast<int64_t>(text.size())},
                         at::kLong);
  auto all = at::empty({3 * n}, at::kLong);
  comm.all_gather(dp, all, mine, "did any rank fail")->wait();
  const int64_t* f = all.data_ptr<int64_t>();
  int first = -1;  // the lowest rank that failed
  bool wrote = false;
  for (int q = n - 1; q >= 0; --q) {
    if (f[3 * q]) first = q;
    wrote = wrote || f[3 * q + 1];
  }
  if (state_lost) {
    if (first < 0) state_lost->clear();
    else if (wrote) *state_lost = what;
  }
  if (first < 0) return {};
  // Every rank learns that rank's error, so each can say what went wrong.
  auto bytes = at::empty({f[3 * first + 2]}, at::kByte);
  if (dp.rank() == first) std::memcpy(bytes.data_ptr(), text.data(), text.size());
  comm.broadcast(dp, bytes, first, "the error of the rank that failed")->wait();
  if (!error.empty()) return error;
  std::string theirs(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(bytes.numel()));
  const auto newline = theirs.find('\n');
  const std::string host = theirs.substr(0, newline);
  theirs.erase(0, newline + 1);
  if (theirs.rfind(what + ": ", 0) == 0) theirs.erase(0, what.size() + 2);
  return what + " failed on rank " + std::to_string(first) + " (host " + host + "): " + theirs;
}

void agree_or_throw(comm::Comm& comm, const comm::Group& dp, const std::string& what, const std::string& error,
                    const bool* wrote_state, std::string* state_lost) {
  if (auto e = agree(comm, dp, what, error, wrote_state, state_lost); !e.empty()) throw std::runtime_error(e);
}

namespace {
const std::pair<at::ScalarType, const char*> kDtypeNames[] = {
    {at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"}, {at::kLong, "I64"},
    {at::kInt, "I32"},   {at::kShort, "I16"},  {at::kChar, "I8"},  {at::kByte, "U8"},       {at::kBool, "BOOL"}};
}  // namespace

std::string safetensors_dtype(at::ScalarType t) {
  for (const auto& [st, name] : kDtypeNames)
    if (st == t) return name;
  throw std::runtime_error(std::string("checkpoints cannot store a tensor of dtype ") + c10::toString(t));
}

at::ScalarType scalar_type_of(const std::string& name) {
  for (const auto& [st, n] : kDtypeNames)
    if (name == n) return st;
  throw std::runtime_error("unknown safetensors dtype " + name);
}

namespace {

// A save that failed on some rank (every rank is here, told by agree()):
// every rank removes the file it wrote, then rank 0 the partial directory
// and `latest`'s new copy, so a full disk is left as full as before the
// save and earlier checkpoints as they were; the ranks return together,
// each throwing `error`.
[[noreturn]] void undo_save(CheckpointTarget& m, const std::string& dir, const std::string& tag,
                            const std::string& own_file, std::string error) {
  std::error_code ec;
  if (!own_file.empty()) fs::remove(own_file, ec);
  m.comm.barrier(m.dp)->wait();  // no rank writes into the directory any more
  std::string left;
  if (m.dp.rank() == 0) {
    left = ckpt::discard_save(dir, tag);
    if (!left.empty()) left = "undoing the save: " + left;
  }
  left = agree(m.comm, m.dp, "undoing the save", left);  // gone before any rank goes on; if not, all say so
  error += left.empty() ? " (the save was undone on every rank: nothing of it is left, earlier checkpoints are "
                          "as they were)"
                        : " (" + left + ")";
  throw std::runtime_error(error);
}

}  // namespace

void save_checkpoint(CheckpointTarget& m, const std::string& dir, const std::string& tag, const json& client_state,
                     bool exclude_frozen) {
  if (tag.empty() || tag.find('/') != std::string::npos || tag[0] == '.' || tag == "latest")
    throw std::invalid_argument("save_checkpoint: tag '" + tag + "' must be a plain name (no '/', not 'latest')");
  const bool lead = m.dp.rank() == 0;
  const std::string partial = ckpt::partial_dir(dir, tag);
  const std::string what = "save_checkpoint";
  std::string error, own_file;  // own_file: what this rank wrote, removed if the save fails
  if (lead) {
    try {
      fs::create_directories(dir);
      fs::remove_all(partial);  // a save of this tag that died earlier
      fs::create_directory(partial);
    } catch (const std::exception& e) {
      error = what + ": " + e.what();
    }
  }
  if (auto e = agree(m.comm, m.dp, what, error); !e.empty()) undo_save(m, dir, tag, own_file, e);

  // This rank's fragments (an unsharded optimizer: every rank holds everything; rank 0 writes it).
  // Streamed group by group: the header is written from the names and
  // shapes, then each group's state -- paged in from NVMe, or brought to the
  // host from a device -- is written and let go before the next, so a save
  // never holds more than one group's state beyond what training does.
  ckpt::SafetensorsWriter writer;
  const bool writes = m.policy.shard_optimizer_state || lead;
  bool any = false;
  if (writes)
    for (const auto& g : m.groups)
      for (const auto& [kind, t] : state_kinds(g))
        for (const auto& [name, f] : pieces(m, g, m.dp.rank())) {
          writer.add(ckpt::tensor_name(name, kind), "F32", {f.numel}, nullptr);
          any = true;
        }
  // Frozen params and buffers: replicated, so rank 0 writes them whole
  // (floating-point ones in at least fp32, whatever the compute dtype).
  std::vector<const ReplicatedTensor*> kept;
  for (const auto& r : m.replicated)
    if (r.buffer || !exclude_frozen) kept.push_back(&r);
  if (lead)
    for (const auto* rp : kept) {
      const auto& r = *rp;
      writer.add(ckpt::tensor_name(r.name, "value"), safetensors_dtype(saved_dtype(r.tensor)), r.tensor.sizes().vec(),
                 nullptr);
      any = true;
    }
  ckpt::FileDigest digest;
  if (any) {
    try {
      own_file = partial + "/" + ckpt::rank_file_name(m.dp.rank());
      writer.open(own_file);
      if (writes)
        for (const auto& g : m.groups) {
          const auto mine = pieces(m, g, m.dp.rank());
          auto state = m.optimizer.resident(g, /*write=*/false);  // NVMe offload: paged in
          for (const auto& [kind, t] : state_kinds(g)) {
            const at::Tensor host = t.is_cpu() ? t : t.to(at::kCPU);
            for (const auto& [name, f] : mine) writer.write_next(host.data_ptr<float>() + f.shard_offset);
          }
          state.done();
        }
      if (lead)
        for (const auto* r : kept)
          writer.write_next(r->tensor.detach().to(at::kCPU, saved_dtype(r->tensor)).contiguous().data_ptr());
      digest = writer.finish();
    } catch (const std::exception& e) {
      error = what + ": " + e.what();
    }
  }
  try {
    fault::point("save");  // test-only (common/fault_injection.h): this rank's file written, nothing published
  } catch (const std::exception& e) {
    if (error.empty()) error = what + ": " + e.what();
  }
  if (auto e = agree(m.comm, m.dp, what, error); !e.empty()) undo_save(m, dir, tag, own_file, e);

  auto mine = at::tensor({static_cast<int64_t>(any), digest.bytes, static_cast<int64_t>(digest.hash)}, at::kLong);
  auto all = at::empty({3 * m.dp.size()}, at::kLong);
  m.comm.all_gather(m.dp, all, mine)->wait();

  if (lead) {
    try {
      ckpt::Manifest man;
      man.tag = tag;
      man.world_size = m.dp.size();
      man.dp_size = m.dp.size();
      man.stage = m.policy.stage;
      man.dtype = c10::toString(m.param_dtype);
      for (const auto& [kind, t] : state_kinds(m.groups.front())) man.kinds.push_back(kind);
      man.config = m.config.to_json();
      man.engine_state = engine_state(m);
      man.client_state = client_state;
      // Per param (in registration order), which rank's file holds which range.
      std::map<int64_t, ckpt::ParamRecord> recs;
      for (const auto& g : m.groups) {
        for (size_t i = 0; i < g.params.size(); ++i)
          recs[g.layout.params[i].param_index] = {g.names[i], g.params[i].sizes().vec(), g.layout.params[i].numel, {}};
        for (int q = 0; q < (m.policy.shard_optimizer_state ? m.dp.size() : 1); ++q)  // stage 0: rank 0 wrote it all
          for (const auto& [name, f] : pieces(m, g, q))
            recs[f.param_index].fragments.push_back({q, f.param_offset, f.param_offset + f.numel});
      }
      for (auto& [idx, r] : recs) man.params.push_back(std::move(r));
      for (const auto* r : kept)
        man.replicated.push_back({r->name, r->buffer ? "buffer" : "param", safetensors_dtype(saved_dtype(r->tensor)),
                                  r->tensor.sizes().vec()});
      for (int q = 0; q < m.dp.size(); ++q)
        if (all[3 * q].item<int64_t>())
          man.files[q] = {ckpt::rank_file_name(q), all[3 * q + 1].item<int64_t>(),
                          static_cast<uint64_t>(all[3 * q + 2].item<int64_t>())};
      ckpt::write_file(partial + "/manifest.json", man.to_json().dump(1) + "\n");
      ckpt::fsync_path(partial);
      ckpt::publish(dir, tag);
    } catch (const std::exception& e) {
      error = what + ": " + e.what();
    }
  }
  if (auto e = agree(m.comm, m.dp, what, error); !e.empty()) undo_save(m, dir, tag, own_file, e);
}

json load_checkpoint(CheckpointTarget& m, const std::string& dir, const std::string& tag, bool optimizer_state,
                     bool step_counters, bool strict) {
  std::string error;
  bool touched = false;  // this rank has started overwriting its state
  std::unique_ptr<ckpt::CheckpointReader> reader;
  try {
    reader = std::make_unique<ckpt::CheckpointReader>(dir, tag);
    const auto& man = reader->manifest();
    std::vector<std::string> names;
    for (const auto& p : man.params) names.push_back(p.name);
    const auto param_shape = [&](const std::string& n) { return reader->find(n) ? &reader->find(n)->shape : nullptr; };
    // Not strict (DeepSpeed's load_module_strict=False): a param only one
    // side has is left alone -- the model's keeps its value and state.
    auto params = model_params(m);
    if (!strict) keep_common(params, names, param_shape);
    check_same_params(params, param_shape, names, "checkpoint " + reader->path());
    std::vector<std::string> replicated_names;
    for (const auto& r : man.replicated) replicated_names.push_back(r.name);
    // The frozen params and buffers to load: not strict, a frozen param the
    // checkpoint left out keeps the model's value.
    std::vector<const ReplicatedTensor*> loaded;
    std::vector<std::pair<std::string, std::vector<int64_t>>> expected;
    for (const auto& r : m.replicated) {
      if (!reader->find_replicated(r.name)) {
        if (!strict) continue;
        if (r.buffer) {
          loaded.push_back(&r);  // named missing below
          expected.emplace_back(r.name, r.tensor.sizes().vec());
          continue;
        }
        throw std::runtime_error("checkpoint " + reader->path() + " has no frozen param " + r.name +
                                 " (saved excluding frozen params?): load it non-strict (load_module_strict=False; "
                                 "LoadOptions::strict false) to keep the model's frozen params");
      }
      loaded.push_back(&r);
      expected.emplace_back(r.name, r.tensor.sizes().vec());
    }
    const auto replicated_shape = [&](const std::string& n) {
      return reader->find_replicated(n) ? &reader->find_replicated(n)->shape : nullptr;
    };
    if (!strict) keep_common(expected, replicated_names, replicated_shape);
    check_same_params(expected, replicated_shape, replicated_names,
                      "checkpoint " + reader->path() + " (frozen params and buffers)");
    for (const auto* r : loaded)
      check_replicated_dtype(*r, reader->find_replicated(r->name)->dtype, "checkpoint " + reader->path());
    if (optimizer_state && !same_optimizer_state(saved_optimizer(man), m.config.optimizer.type))
      throw std::runtime_error("checkpoint " + reader->path() + " holds optimizer state of " + saved_optimizer(man) +
                               "; this engine's optimizer is " + to_string(m.config.optimizer.type) +
                               ", whose state differs. Use the same optimizer, or start from its weights with "
                               "load_weights() (zero-ckpt consolidate writes them)");
    for (const auto& [kind, t] : state_kinds(m.groups.front()))
      if ((optimizer_state || kind == "master") && std::find(man.kinds.begin(), man.kinds.end(), kind) == man.kinds.end())
        throw std::runtime_error("checkpoint " + reader->path() + " has no " + kind +
                                 " (saved with another optimizer?)");
    touched = true;
    fill_state(m, [&](const std::string& n, const std::string& k, int64_t a, int64_t b, float* out) {
      if (!strict && !reader->find(n)) return;  // the model's own
      reader->read(n, k, a, b, out);
      fault::point("load");  // test-only (common/fault_injection.h): part of the state read
    }, /*master_only=*/!optimizer_state);
    for (const auto* r : loaded)
      copy_replicated(*r, reader->find_replicated(r->name)->dtype, reader->replicated_data(r->name));
  } catch (const std::exception& e) {
    error = std::string("load_checkpoint: ") + e.what();
  }
  agree_or_throw(m.comm, m.dp, "load_checkpoint", error, &touched, &m.state_lost);
  restore_engine_state(m, reader->manifest().engine_state, optimizer_state, step_counters);
  if (const auto change = describe_resume_change(reader->manifest(), m); !change.empty()) m.log(change);
  m.after_load();
  return reader->manifest().client_state;
}

void load_weights(CheckpointTarget& m, const std::string& path) {
  std::string error;
  bool touched = false;
  try {
    ckpt::SafetensorsFile f(path);
    std::vector<std::string> names;
    for (const auto& [n, e] : f.entries()) names.push_back(n);
    auto expected = model_params(m);
    for (auto& r : model_replicated(m)) expected.push_back(std::move(r));
    check_same_params(expected, [&](const std::string& n) { return f.has(n) ? &f.entry(n).shape : nullptr; },
                      names, "weights file " + path);
    for (const auto& r : m.replicated) check_replicated_dtype(r, f.entry(r.name).dtype, "weights file " + path);
    touched = true;
    fill_state(m, [&](const std::string& n, const std::string&, int64_t a, int64_t b, float* out) {
      const auto& e = f.entry(n);
      const char* d = f.data(n);
      if (e.dtype == "F32") {
        std::memcpy(out, reinterpret_cast<const float*>(d) + a, static_cast<size_t>(b - a) * 4);
      } else if (e.dtype == "BF16" || e.dtype == "F16") {
        auto src = at::from_blob(const_cast<char*>(d) + a * 2, {b - a}, e.dtype == "BF16" ? at::kBFloat16 : at::kHalf);
        at::from_blob(out, {b - a}, at::kFloat).copy_(src);
      } else {
        throw std::runtime_error("weights file " + path + ": param " + n + " is " + e.dtype + " (F32, BF16 or F16 expected)");
      }
    }, true);
    for (const auto& r : m.replicated) copy_replicated(r, f.entry(r.name).dtype, f.data(r.name));
  } catch (const std::exception& e) {
    error = std::string("load_weights: ") + e.what();
  }
  agree_or_throw(m.comm, m.dp, "load_weights", error, &touched, &m.state_lost);
  m.after_load();
}

}  // namespace zero
