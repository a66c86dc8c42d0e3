#include "engine/muon_step.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <unordered_map>

#include <c10/core/DeviceGuard.h>

#include "common/guard_device.h"
#include "optim/kernels.h"

#ifdef ZERO_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "optim/cuda/kernels.h"
#endif

namespace zero {

bool muon_uses(const std::string& name, int64_t ndim) {
  if (ndim < 2) return false;
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find("embed") == std::string::npos && lower.find("lm_head") == std::string::npos;
}

at::Tensor muon_orthogonalize(const at::Tensor& nesterov, at::IntArrayRef param_shape) {
  // The quintic's coefficients (Jordan et al. 2024): slope 3.4445 at 0.
  constexpr double a = 3.4445, b = -4.7750, c = 2.0315;
  at::Tensor x = nesterov.to(at::kFloat);
  if (x.dim() == 4) x = x.reshape({x.size(0), -1});  // a conv filter as one matrix
  const bool tall = x.size(-2) > x.size(-1);
  if (tall) x = x.transpose(-2, -1);
  x = x / (at::linalg_vector_norm(x, 2, at::IntArrayRef{-2, -1}, /*keepdim=*/true) + 1e-7);
  for (int i = 0; i < 5; ++i) {
    const at::Tensor gram = x.matmul(x.transpose(-2, -1));
    const at::Tensor poly = b * gram + c * gram.matmul(gram);
    x = a * x + poly.matmul(x);
  }
  if (tall) x = x.transpose(-2, -1);
  const auto rows = static_cast<double>(param_shape[param_shape.size() - 2]);
  const auto cols = static_cast<double>(param_shape[param_shape.size() - 1]);
  return x * std::sqrt(std::max(1.0, rows / cols));
}

namespace {

// As FlatOptimizer's: where the update also writes the params beside the master.
optim::Out16 out_kind(const at::Tensor& dest, const partition::FlatGroup& g) {
  if (dest.data_ptr() == g.master.data_ptr()) return optim::Out16::None;
  const bool bf16 = g.storage_dtype == at::kBFloat16;
  if (dest.scalar_type() == at::kFloat) return bf16 ? optim::Out16::BF16Widened : optim::Out16::FP16Widened;
  return bf16 ? optim::Out16::BF16 : optim::Out16::FP16;
}

struct Matrix {
  size_t group;
  size_t slot;  // index into the group's params
  int64_t numel;
  int owner = 0;
  int64_t out_offset = 0;  // in its owner's segment of the updates
};

// A piece of a Muon matrix on one rank's shard (or the whole matrix, stage 0).
struct Piece {
  int64_t matrix;
  int64_t param_offset, numel;
  int64_t master_offset;  // in the holder's master
  int64_t seg_offset;     // in the holder's segment of the Nesterov inputs
};

#ifdef ZERO_WITH_CUDA
void* stream_of(const at::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
#else
[[noreturn]] void no_cuda(const at::Tensor& t) {
  throw std::logic_error("a CUDA master on " + t.device().str() + ", but zero-cpp was built without CUDA");
}
#endif

}  // namespace

void muon_update(std::vector<partition::FlatGroup>& groups, const std::vector<at::Tensor>& grads,
                 const MuonStep& s) {
  if (groups.empty()) return;
  const auto& o = s.optimizer;
  const bool sharded = s.policy.shard_optimizer_state;
  const int n = sharded ? s.dp.size() : 1;   // segments: one per shard holder
  const int me = sharded ? s.dp.rank() : 0;  // stage 0: this rank holds (and orthogonalises) all
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const auto& g = groups[gi];
    if ((g.master.is_cpu() && !grads[gi].is_cpu()) ||
        s.policy.update_destination(g, s.dp.rank()).device() != g.master.device())
      throw std::invalid_argument("optimizer Muon: offload_optimizer / offload_param to the host of a model on " +
                                  grads[gi].device().str() + " is not supported yet");
  }

  // The matrices, their owners (largest first, each to the least-loaded
  // rank: the same on every rank) and their place in the owner's segment.
  std::vector<Matrix> mats;
  std::vector<std::unordered_map<int64_t, int64_t>> matrix_of(groups.size());  // param_index -> matrix
  std::vector<std::unordered_map<int64_t, std::pair<double, double>>> hyper_of(groups.size());
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const auto& g = groups[gi];
    for (size_t i = 0; i < g.params.size(); ++i) {
      const int64_t pi = g.layout.params[i].param_index;
      hyper_of[gi][pi] = s.hyper(g.params[i]);
      if (!muon_uses(g.names[i], g.params[i].dim())) continue;
      matrix_of[gi][pi] = static_cast<int64_t>(mats.size());
      mats.push_back({gi, i, g.layout.params[i].numel});
    }
  }
  std::vector<int64_t> order(mats.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return mats[x].numel > mats[y].numel; });
  std::vector<int64_t> load(n, 0);
  for (int64_t m : order) {
    const int owner = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    mats[m].owner = owner;
    mats[m].out_offset = load[owner];
    load[owner] += mats[m].numel;
  }
  const int64_t out_seg = n ? *std::max_element(load.begin(), load.end()) : 0;

  // Every holder's Muon pieces, in its segment's order (index arithmetic
  // only: each rank knows where every piece travels).
  const auto fragments = [&](size_t gi, int r) {
    const auto& layout = groups[gi].layout;
    if (sharded) return layout.fragments(r);
    std::vector<partition::Fragment> whole;
    for (const auto& slot : layout.params) whole.push_back({slot.param_index, 0, slot.offset, slot.numel});
    return whole;
  };
  std::vector<std::vector<Piece>> pieces(n);
  std::vector<std::vector<std::pair<int, size_t>>> pieces_of(mats.size());  // matrix -> (holder, piece)
  int64_t in_seg = 0;
  for (int r = 0; r < n; ++r) {
    int64_t size = 0;
    for (size_t gi = 0; gi < groups.size(); ++gi)
      for (const auto& f : fragments(gi, r)) {
        auto it = matrix_of[gi].find(f.param_index);
        if (it == matrix_of[gi].end()) continue;
        pieces_of[it->second].push_back({r, pieces[r].size()});
        pieces[r].push_back({it->second, f.param_offset, f.numel, f.shard_offset, size});
        size += f.numel;
      }
    in_seg = std::max(in_seg, size);
  }

  const at::Tensor& first = groups.front().master;
  const c10::OptionalDeviceGuard on_device(guard_device(first));
  const auto opts = first.options().dtype(at::kFloat);
  const optim::MuonHyper muon_base{static_cast<float>(s.lr), static_cast<float>(o.momentum), 0.0f};
  const double adam_ratio = o.lr > 0 ? o.adam_lr / o.lr : 0.0;

  // Pass 1, over this rank's pieces: Muon's momentum (its Nesterov input
  // into the send segment), and the whole AdamW step of every other param.
  at::Tensor send = at::empty({in_seg}, opts);
  {
    size_t next = 0;  // this rank's Muon pieces come in fragment order
    for (size_t gi = 0; gi < groups.size(); ++gi) {
      auto& g = groups[gi];
      const at::Tensor dest = s.policy.update_destination(g, s.dp.rank());
      const auto kind = out_kind(dest, g);
      for (const auto& f : fragments(gi, me)) {
        const int64_t off = f.shard_offset;
        const float* grad = grads[gi].data_ptr<float>() + off;
        float* m = g.exp_avg.data_ptr<float>() + off;
        const auto [lr_scale, wd] = hyper_of[gi].at(f.param_index);
        if (matrix_of[gi].count(f.param_index)) {
          float* out = send.data_ptr<float>() + pieces[me][next++].seg_offset;
          if (g.master.is_cuda()) {
#ifdef ZERO_WITH_CUDA
            optim::cuda::muon_momentum(grad, m, out, f.numel, muon_base, s.grad_scale, stream_of(g.master));
#else
            no_cuda(g.master);
#endif
          } else {
            optim::muon_momentum(grad, m, out, f.numel, muon_base, s.grad_scale);
          }
          continue;
        }
        const optim::AdamHyper h{static_cast<float>(s.lr * adam_ratio * lr_scale), static_cast<float>(o.betas[0]),
                                 static_cast<float>(o.betas[1]), static_cast<float>(o.eps), static_cast<float>(wd),
                                 s.step, /*adam_w_mode=*/true, /*bias_correction=*/true};
        float* p = g.master.data_ptr<float>() + off;
        float* v = g.exp_avg_sq.data_ptr<float>() + off;
        void* out = kind == optim::Out16::None ? nullptr
                                               : static_cast<char*>(dest.data_ptr()) + off * optim::out16_bytes(kind);
        if (g.master.is_cuda()) {
#ifdef ZERO_WITH_CUDA
          optim::cuda::adam_update(p, grad, m, v, f.numel, h, s.grad_scale, out, kind, stream_of(g.master));
#else
          no_cuda(g.master);
#endif
        } else {
          optim::adam_update(p, grad, m, v, f.numel, h, s.grad_scale, out, kind);
        }
      }
    }
  }
  if (mats.empty()) return;

  // The Nesterov inputs to the owners: one all-gather of every holder's
  // segment (stage 0: this rank's own buffer, whole matrices).
  at::Tensor inputs = send;
  if (n > 1) {
    inputs = at::empty({n * in_seg}, opts);
    s.comm.all_gather(s.dp, inputs, send, "muon inputs")->wait();
  }
  // The owner assembles each of its matrices and orthogonalises it.
  at::Tensor mine = at::zeros({out_seg}, opts);
  for (size_t mi = 0; mi < mats.size(); ++mi) {
    const Matrix& mat = mats[mi];
    if (mat.owner != me) continue;
    at::Tensor whole = at::empty({mat.numel}, opts);
    for (const auto& [r, k] : pieces_of[mi]) {
      const Piece& pc = pieces[r][k];
      whole.narrow(0, pc.param_offset, pc.numel).copy_(inputs.narrow(0, r * in_seg + pc.seg_offset, pc.numel));
    }
    const at::Tensor& param = groups[mat.group].params[mat.slot];
    mine.narrow(0, mat.out_offset, mat.numel)
        .copy_(muon_orthogonalize(whole.view(param.sizes()), param.sizes()).reshape({-1}));
  }
  // The updates back to the holders: a second all-gather, of the owners' segments.
  at::Tensor updates = mine;
  if (n > 1) {
    updates = at::empty({n * out_seg}, opts);
    s.comm.all_gather(s.dp, updates, mine, "muon updates")->wait();
  }

  // Pass 2, over this rank's Muon pieces: decay, step, 16-bit write.
  for (const Piece& pc : pieces[me]) {
    const Matrix& mat = mats[pc.matrix];
    auto& g = groups[mat.group];
    const at::Tensor dest = s.policy.update_destination(g, s.dp.rank());
    const auto kind = out_kind(dest, g);
    const auto [lr_scale, wd] = hyper_of[mat.group].at(g.layout.params[mat.slot].param_index);
    optim::MuonHyper h = muon_base;
    h.lr = static_cast<float>(s.lr * lr_scale);
    h.weight_decay = static_cast<float>(wd);
    float* p = g.master.data_ptr<float>() + pc.master_offset;
    const float* u = updates.data_ptr<float>() + mat.owner * out_seg + mat.out_offset + pc.param_offset;
    void* out = kind == optim::Out16::None
                    ? nullptr
                    : static_cast<char*>(dest.data_ptr()) + pc.master_offset * optim::out16_bytes(kind);
    if (g.master.is_cuda()) {
#ifdef ZERO_WITH_CUDA
      optim::cuda::muon_apply(p, u, pc.numel, h, out, kind, stream_of(g.master));
#else
      no_cuda(g.master);
#endif
    } else {
      optim::muon_apply(p, u, pc.numel, h, out, kind);
    }
  }
}

}  // namespace zero
