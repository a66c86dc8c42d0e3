// CUDA IPC staging buffers behind the Transport interface (comm/cuda_ipc_transport.h).
#include "comm/cuda_ipc_transport.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "comm/cuda/ipc_buffers.h"
#include "comm/cuda/peer_sum.h"
#include "comm/device_placement.h"
#include "comm/group_impl.h"
#include "comm/shm/lane.h"
#include "comm/shm_transport.h"
#include "comm/signature.h"
#include "comm/work.h"

namespace zero::comm {

// One group's staging buffers: this rank's, and its peers' mapped here.
struct CudaIpcGroup {
  c10::Device device{c10::kCUDA, 0};
  int64_t bytes = 0;                // per rank
  // This rank's buffer: a block of the caching allocator (its stats count
  // it, and an allocation that finds the device full frees cached blocks
  // first), or raw cudaMalloc memory where such a block cannot be exported
  // (expandable segments).
  at::Tensor own_block;
  void* own_raw = nullptr;
  std::vector<char*> staging;       // by group rank; this rank's own buffer at its rank
  std::vector<void*> mapped;        // peers' allocations opened here, to close
  c10::cuda::CUDAStream stream = c10::cuda::getDefaultCUDAStream();
  std::chrono::milliseconds timeout{0};  // the group's collective timeout
  // The direct path (every rank asked for it: ZERO_CUDA_IPC_DIRECT): each
  // rank's interprocess events, recorded on its stream where its input is
  // ready and (an all-reduce) where its slice is summed; the peers' opened
  // here, by group rank (this rank's own at its rank); and the peers'
  // inputs mapped here, kept across collectives when every rank asked
  // (ZERO_CUDA_IPC_DIRECT_CACHE; comm/cuda/ipc_buffers.h).
  bool direct = false, cache_mappings = false;
  std::vector<cudaEvent_t> ready, summed;
  cuda::PeerDeviceBuffers peer_inputs;
  std::atomic<int64_t> direct_ops{0};
  ~CudaIpcGroup() {
    peer_inputs.close_all();
    for (void* p : mapped) cudaIpcCloseMemHandle(p);
    if (own_raw) cudaFree(own_raw);
    for (const auto* events : {&ready, &summed})
      for (cudaEvent_t e : *events)
        if (e) cudaEventDestroy(e);
  }
};

namespace {

void check(cudaError_t err, const std::string& what) {
  if (err != cudaSuccess) throw CommError(what + ": " + cudaGetErrorString(err));
}

int64_t staging_bytes() {
  const char* s = std::getenv("ZERO_CUDA_IPC_STAGING_BYTES");
  const int64_t v = s && *s ? std::atoll(s) : (int64_t{32} << 20);
  return std::max<int64_t>(v, 1 << 16) & ~int64_t{255};
}

// What a peer needs to map a buffer: the IPC handle of the allocation it
// lies in, and its offset there (a caching-allocator block is part of a
// larger cudaMalloc'd segment).
struct Exported {
  cudaIpcMemHandle_t handle{};
  uint64_t offset = 0;
  cudaIpcEventHandle_t ready{}, summed{};  // the direct path's, where this rank wants it
  uint8_t wants_direct = 0, wants_cache = 0;
};

// This rank's staging buffer (its address into `own`) and its export; an
// error message if either failed.
std::string allocate_and_export(CudaIpcGroup& ipc, Exported& out, char*& own) {
  try {
    ipc.own_block = at::empty({ipc.bytes}, at::TensorOptions().dtype(at::kByte).device(ipc.device));
    void* ptr = ipc.own_block.data_ptr();
    size_t segment = 0;
    void* base = nullptr;
    try {
      base = c10::cuda::CUDACachingAllocator::getBaseAllocation(ptr, &segment);
    } catch (const std::exception&) {
      // An expandable segment has no base allocation to export: raw memory below.
    }
    if (base && cudaIpcGetMemHandle(&out.handle, base) == cudaSuccess) {
      out.offset = static_cast<uint64_t>(static_cast<char*>(ptr) - static_cast<char*>(base));
      own = static_cast<char*>(ptr);
      return {};
    }
    (void)cudaGetLastError();  // clear the failed export
    ipc.own_block = at::Tensor();
    check(cudaMalloc(&ipc.own_raw, static_cast<size_t>(ipc.bytes)), "cudaMalloc of the staging buffer");
    check(cudaIpcGetMemHandle(&out.handle, ipc.own_raw), "cudaIpcGetMemHandle");
    out.offset = 0;
    own = static_cast<char*>(ipc.own_raw);
    return {};
  } catch (const std::exception& e) {
    return first_line(e.what());
  }
}

// The direct path's events of this rank, their handles into `mine`; an
// error message if any failed.
std::string make_own_events(CudaIpcGroup& ipc, int rank, Exported& mine) {
  for (auto [events, handle] : {std::pair{&ipc.ready, &mine.ready}, std::pair{&ipc.summed, &mine.summed}}) {
    cudaEvent_t& own = (*events)[rank];
    cudaError_t err = cudaEventCreateWithFlags(&own, cudaEventDisableTiming | cudaEventInterprocess);
    if (err == cudaSuccess) err = cudaIpcGetEventHandle(handle, own);
    if (err != cudaSuccess)
      return std::string("an interprocess event for the direct path: ") + cudaGetErrorString(err) +
             " (ZERO_CUDA_IPC_DIRECT=off stages every collective instead)";
  }
  mine.wants_direct = 1;
  mine.wants_cache = cuda_ipc_direct_cache_by_env() ? 1 : 0;
  return {};
}

// Collective over the group through its store: every rank allocates and
// publishes its buffer, opens its peers', and all agree it worked (so a
// failure is an error on every rank, not a hang on some).
std::shared_ptr<CudaIpcGroup> make_ipc_group(const Group& g, c10::Device device, const std::string& lane) {
  auto ipc = std::make_shared<CudaIpcGroup>();
  ipc->device = device;
  ipc->bytes = staging_bytes();
  ipc->staging.assign(static_cast<size_t>(g.size()), nullptr);
  c10::cuda::CUDAGuard guard(device);
  c10d::Store& store = *g.impl().store;
  Exported mine;
  std::string error = allocate_and_export(*ipc, mine, ipc->staging[g.rank()]);
  const auto* raw = reinterpret_cast<const uint8_t*>(&mine);
  ipc->timeout = g.impl().timeout;
  ipc->ready.assign(static_cast<size_t>(g.size()), nullptr);
  ipc->summed.assign(static_cast<size_t>(g.size()), nullptr);
  if (error.empty() && cuda_ipc_direct_by_env()) error = make_own_events(*ipc, g.rank(), mine);
  const std::string key = "ipc_" + lane + "_";
  store.set(key + "handle_" + std::to_string(g.rank()), std::vector<uint8_t>(raw, raw + sizeof mine));
  std::vector<Exported> peers(static_cast<size_t>(g.size()));
  for (int q = 0; q < g.size(); ++q) {
    if (q == g.rank()) continue;
    const auto bytes = store.get(key + "handle_" + std::to_string(q));
    std::memcpy(&peers[q], bytes.data(), std::min(bytes.size(), sizeof(Exported)));
  }
  ipc->direct = mine.wants_direct != 0;
  ipc->cache_mappings = mine.wants_cache != 0;
  for (int q = 0; q < g.size(); ++q) {
    if (q == g.rank()) continue;
    ipc->direct = ipc->direct && peers[q].wants_direct != 0;
    ipc->cache_mappings = ipc->cache_mappings && peers[q].wants_cache != 0;
  }
  ipc->cache_mappings = ipc->cache_mappings && ipc->direct;
  for (int q = 0; q < g.size() && error.empty(); ++q) {
    if (q == g.rank()) continue;
    const Exported& peer = peers[q];
    if (ipc->direct) {
      cudaError_t err = cudaIpcOpenEventHandle(&ipc->ready[q], peer.ready);
      if (err == cudaSuccess) err = cudaIpcOpenEventHandle(&ipc->summed[q], peer.summed);
      if (err != cudaSuccess) {
        error = "cudaIpcOpenEventHandle of rank " + std::to_string(q) + "'s events: " + cudaGetErrorString(err) +
                " (ZERO_CUDA_IPC_DIRECT=off stages every collective instead)";
        break;
      }
    }
    void* base = nullptr;
    const cudaError_t err = cudaIpcOpenMemHandle(&base, peer.handle, cudaIpcMemLazyEnablePeerAccess);
    if (err != cudaSuccess) {
      error = "cudaIpcOpenMemHandle of rank " + std::to_string(q) + "'s buffer: " + cudaGetErrorString(err);
      break;
    }
    ipc->mapped.push_back(base);
    ipc->staging[q] = static_cast<char*>(base) + peer.offset;
  }
  const std::string verdict = error.empty() ? "ok" : error;
  store.set(key + "ok_" + std::to_string(g.rank()), std::vector<uint8_t>(verdict.begin(), verdict.end()));
  for (int q = 0; q < g.size(); ++q) {
    const auto v = store.get(key + "ok_" + std::to_string(q));
    const std::string s(v.begin(), v.end());
    if (s != "ok")
      throw CommError("CUDA IPC setup on " + g.describe() + " failed on rank " + std::to_string(q) + ": " + s +
                      " (ZERO_CUDA_IPC=off sends CUDA collectives to NCCL instead)");
  }
  ipc->stream = c10::cuda::getStreamFromPool(false, device.index());
  if (g.rank() == 0 && lane == "main") {
    const char* how = !ipc->direct ? "staged through each rank's buffer (ZERO_CUDA_IPC_DIRECT=on reads the peers' "
                                     "inputs in place)"
                      : ipc->cache_mappings ? "direct: each rank reads its peers' inputs in place, ordered by their "
                                              "events, its mappings kept (an input that cannot be shared: staged)"
                                            : "direct: each rank reads its peers' inputs in place, ordered by their "
                                              "events (an input that cannot be shared: staged)";
    std::fprintf(stderr, "[zero-cpp] %s: CUDA IPC %s\n", g.describe().c_str(), how);
  }
  return ipc;
}

// This rank's GPU, named so that every process sees the same name (a UUID).
std::string gpu_uuid(c10::Device device) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device.index()), "cudaGetDeviceProperties on " + device.str());
  const cudaUUID_t& uuid = prop.uuid;
  static const char* hex = "0123456789abcdef";
  std::string s = "GPU-";
  for (int i = 0; i < 16; ++i) {
    const auto b = static_cast<unsigned char>(uuid.bytes[i]);
    s += hex[b >> 4];
    s += hex[b & 15];
    if (i == 3 || i == 5 || i == 7 || i == 9) s += '-';
  }
  return s;
}

// Whether the group's CUDA collectives go through CUDA IPC, decided at its
// first one (comm/device_placement.h) from every rank's host and GPU, and
// said once, by the group's rank 0. Collective over the group (store
// rounds); the caller holds impl.device_backend_mu.
bool decide_cuda_ipc(const Group& g, Group::Impl& impl, c10::Device device) {
  c10d::Store& store = *impl.store;
  const std::string mine = host_identity() + "\n" + gpu_uuid(device);
  store.set("cuda_route_" + std::to_string(g.rank()), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<RankGpu> ranks;
  for (int q = 0; q < g.size(); ++q) {
    const auto v = store.get("cuda_route_" + std::to_string(q));
    const std::string s(v.begin(), v.end());
    const auto cut = s.rfind('\n');
    ranks.push_back({s.substr(0, cut), s.substr(cut + 1)});
  }
  const CudaRoute route = choose_cuda_route(ranks, cuda_ipc_allowed_by_env());
  if (route.via == CudaRoute::Via::Neither) throw CommError(g.describe() + ": " + route.why);
  if (g.rank() == 0) std::fprintf(stderr, "[zero-cpp] %s: CUDA collectives through %s\n", g.describe().c_str(), route.why.c_str());
  return route.via == CudaRoute::Via::CudaIpc;
}

class CudaIpcTransport : public Transport {
 public:
  std::string name() const override { return "cuda_ipc"; }

  // Ranks sharing a GPU only (comm/device_placement.h); each with its own: NCCL.
  bool supports_on(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel,
                   at::Device device) const override {
    if (!supports(g, op, dtype, numel)) return false;
    Group::Impl& impl = g.impl();
    std::lock_guard<std::mutex> lock(impl.device_backend_mu);
    if (!impl.cuda_ipc_chosen) impl.cuda_ipc_chosen = decide_cuda_ipc(g, impl, device);
    return *impl.cuda_ipc_chosen;
  }

  bool supports(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t) const override {
    if (!shm_lane(g, op) || !cuda_ipc_allowed_by_env()) return false;
    switch (op) {
      case CollectiveOp::AllGather:
      case CollectiveOp::Broadcast: return true;
      case CollectiveOp::ReduceScatter:
      case CollectiveOp::AllReduce: return reducible_elem(dtype).has_value();
      case CollectiveOp::Barrier: return false;
    }
    return false;
  }

  // Bytes this rank reads from its peers' buffers.
  int64_t wire_bytes(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel) const override {
    const int64_t n = g.size(), elem = static_cast<int64_t>(c10::elementSize(dtype));
    switch (op) {
      case CollectiveOp::AllGather:
      case CollectiveOp::ReduceScatter: return (n - 1) * (numel / n) * elem;
      case CollectiveOp::AllReduce: return (n - 1) * numel * elem;
      case CollectiveOp::Broadcast: return numel * elem;
      case CollectiveOp::Barrier: return 0;
    }
    return 0;
  }

  WorkHandle all_gather(const Group& g, at::Tensor out_flat, at::Tensor in_shard, const Signature& sig) override {
    const int64_t ei = in_shard.element_size(), eo = out_flat.element_size();
    const bool widen = out_flat.scalar_type() != in_shard.scalar_type();
    const auto in_type = reducible_elem(in_shard.scalar_type());
    return submit(g, CollectiveOp::AllGather, "allgather", sig, {out_flat, in_shard}, [=](Run& run) {
      const int64_t shard = in_shard.numel(), piece = run.ipc->bytes / ei;
      const auto* in = static_cast<const char*>(in_shard.data_ptr());
      auto* out = static_cast<char*>(out_flat.data_ptr());
      std::vector<const char*> srcs;
      if (run.open_direct(cuda::export_device_buffer(in_shard, run.ipc->cache_mappings), in, srcs)) {
        for (int q = 0; q < run.size; ++q) {
          char* dst = out + q * shard * eo;
          if (widen) run.sum({srcs[q]}, *in_type, dst, shm::Elem::F32, shard, false);
          else if (dst != srcs[q]) run.copy(dst, srcs[q], shard * ei);  // in place: this rank's is there
        }
        run.close_direct();
        return;
      }
      for (int64_t a = 0; a == 0 || a < shard; a += piece) {
        const int64_t n = std::min(piece, shard - a);
        run.copy(run.own(), in + a * ei, n * ei);
        run.handshake();
        for (int q = 0; q < run.size; ++q) {
          const char* src = q == run.rank ? in + a * ei : run.peer(q);
          char* dst = out + (q * shard + a) * eo;
          if (widen) run.sum({src}, *in_type, dst, shm::Elem::F32, n, false);
          else if (dst != src) run.copy(dst, src, n * ei);
        }
        run.handshake();
      }
    });
  }

  WorkHandle reduce_scatter(const Group& g, at::Tensor out_shard, at::Tensor in_flat, ReduceOp op,
                            const Signature& sig) override {
    const int64_t ei = in_flat.element_size(), eo = out_shard.element_size();
    const auto in_type = *reducible_elem(in_flat.scalar_type()), out_type = *reducible_elem(out_shard.scalar_type());
    const bool average = op == ReduceOp::Avg;
    return submit(g, CollectiveOp::ReduceScatter, "reduce_scatter", sig, {out_shard, in_flat}, [=](Run& run) {
      const int64_t shard = out_shard.numel(), size = run.size;
      int64_t piece = std::max<int64_t>(1, run.ipc->bytes / (size * ei));  // one piece per destination rank
      if (piece >= 64) piece &= ~int64_t{63};
      const auto* in = static_cast<const char*>(in_flat.data_ptr());
      auto* out = static_cast<char*>(out_shard.data_ptr());
      std::vector<const char*> inputs;
      if (run.open_direct(cuda::export_device_buffer(in_flat, run.ipc->cache_mappings), in, inputs)) {
        // Slice `rank` of every rank's input; `out` may be this rank's own
        // (peer_sum reads an element from every source before writing it).
        std::vector<const char*> srcs;
        for (int q = 0; q < size; ++q) srcs.push_back(inputs[q] + run.rank * shard * ei);
        run.sum(srcs, in_type, out, out_type, shard, average);
        run.close_direct();
        return;
      }
      for (int64_t a = 0; a == 0 || a < shard; a += piece) {
        const int64_t n = std::min(piece, shard - a);
        for (int r = 0; r < size; ++r) run.copy(run.own() + r * piece * ei, in + (r * shard + a) * ei, n * ei);
        run.handshake();
        std::vector<const char*> srcs;
        for (int q = 0; q < size; ++q) srcs.push_back(run.peer(q) + run.rank * piece * ei);
        run.sum(srcs, in_type, out + a * eo, out_type, n, average);
        run.handshake();
      }
    });
  }

  WorkHandle all_reduce(const Group& g, at::Tensor t, ReduceOp op, const Signature& sig) override {
    const auto type = *reducible_elem(t.scalar_type());
    const bool average = op == ReduceOp::Avg;
    return submit(g, CollectiveOp::AllReduce, "all_reduce", sig, {t}, [=](Run& run) {
      const int64_t e = t.element_size(), piece = run.ipc->bytes / e, numel = t.numel();
      auto* d = static_cast<char*>(t.data_ptr());
      std::vector<const char*> bufs;
      if (run.open_direct(cuda::export_device_buffer(t, run.ipc->cache_mappings), d, bufs)) {
        // Rank q sums slice q of every buffer into its own, in place; then,
        // each slice summed (its owner's event recorded again), every rank
        // copies the others' summed slices. Slices of whole 256-byte lines.
        const int64_t per = ((numel + run.size - 1) / run.size + 127) / 128 * 128;
        const auto begin = [&](int q) { return std::min<int64_t>(numel, q * per); };
        const auto count = [&](int q) { return std::min<int64_t>(numel, (q + 1) * per) - begin(q); };
        std::vector<const char*> srcs;
        for (int q = 0; q < run.size; ++q) srcs.push_back(bufs[q] + begin(run.rank) * e);
        run.delay_rank0_for_testing();
        run.sum(srcs, type, d + begin(run.rank) * e, type, count(run.rank), average);
        run.publish_summed();
        for (int q = 0; q < run.size; ++q)
          if (q != run.rank) run.copy(d + begin(q) * e, bufs[q] + begin(q) * e, count(q) * e);
        run.close_direct();
        return;
      }
      for (int64_t a = 0; a == 0 || a < numel; a += piece) {
        const int64_t n = std::min(piece, numel - a);
        run.copy(run.own(), d + a * e, n * e);
        run.handshake();
        std::vector<const char*> srcs;
        for (int q = 0; q < run.size; ++q) srcs.push_back(run.peer(q));
        run.sum(srcs, type, d + a * e, type, n, average);  // every rank, same order: same bits
        run.handshake();
      }
    });
  }

  WorkHandle broadcast(const Group& g, at::Tensor t, int root, const Signature& sig) override {
    return submit(g, CollectiveOp::Broadcast, "broadcast", sig, {t}, [=](Run& run) {
      const int64_t bytes = t.numel() * t.element_size();
      auto* d = static_cast<char*>(t.data_ptr());
      std::vector<const char*> srcs;
      const auto mine = run.rank == root ? cuda::export_device_buffer(t, run.ipc->cache_mappings) : cuda::nothing_to_read();
      if (run.open_direct(mine, d, srcs)) {
        if (run.rank != root) run.copy(d, srcs[root], bytes);
        run.close_direct();
        return;
      }
      for (int64_t a = 0; a == 0 || a < bytes; a += run.ipc->bytes) {
        const int64_t n = std::min(run.ipc->bytes, bytes - a);
        if (run.rank == root) run.copy(run.own(), d + a, n);
        run.handshake();
        if (run.rank != root) run.copy(d + a, run.peer(root), n);
        run.handshake();
      }
    });
  }

  WorkHandle barrier(const Group& g, const Signature&) override {
    throw CommError("barrier on " + g.describe() + ": not served by CUDA IPC");
  }

 private:
  // One collective, run by the lane (its worker, or a caller waiting on it:
  // hence the device guard and the explicit stream): its group's buffers,
  // its stream, and the handshakes (lane rounds carrying the signature).
  struct Run {
    std::shared_ptr<CudaIpcGroup> ipc;
    int rank = 0, size = 0;
    std::string text;
    const shm::Lane::Handshake* round = nullptr;
    char* own() const { return ipc->staging[rank]; }
    const char* peer(int q) const { return ipc->staging[q]; }
    void copy(void* dst, const void* src, int64_t bytes) {
      direct_step([&] {
        if (bytes > 0)
          check(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDefault, ipc->stream), text);
      });
    }
    void sum(const std::vector<const char*>& srcs, shm::Elem in, void* out, shm::Elem out_type, int64_t n,
             bool average) {
      direct_step([&] {
        std::vector<const void*> s(srcs.begin(), srcs.end());
        cuda::peer_sum(s.data(), static_cast<int>(s.size()), in, out, out_type, n, average, ipc->stream.stream());
      });
    }
    // This rank's copies are done; then a round with every rank.
    void handshake() {
      check(cudaStreamSynchronize(ipc->stream), text);
      (*round)();
    }

    // ---- the direct path (comm/cuda_ipc_transport.h) ----
    // Inside a direct collective a rank's failure (a peer's buffer that will
    // not open, a CUDA error) is not thrown where it happens -- its peers
    // would wait out the timeout in a round it never joins -- but kept, the
    // device work after it skipped, and said in the collective's next round,
    // where every rank learns it and the collective fails on all of them.
    bool in_direct = false;
    std::string direct_error;
    template <typename Step>
    void direct_step(Step&& step) {
      if (!in_direct) return step();
      if (!direct_error.empty()) return;
      try {
        step();
      } catch (const std::exception& e) {
        direct_error = first_line(e.what());
      }
    }
    // A round that carries each rank's state: false (and the rest of the
    // collective's device work skipped) if any rank has failed.
    bool all_well() {
      const uint8_t mine = direct_error.empty() ? 1 : 0;
      std::vector<uint8_t> all(static_cast<size_t>(size));
      round->exchange(&mine, 1, all.data());
      for (int q = 0; q < size; ++q)
        if (!all[q] && direct_error.empty()) direct_error = "rank " + std::to_string(q) + " failed (its error says why)";
      return direct_error.empty();
    }

    // The first round: this rank's ready event recorded where its input is
    // ready, `mine` published. True when every rank's input can be read in
    // place: then `srcs` holds every rank's input as mapped here (this
    // rank's own, `own`, at its rank; null where a rank publishes nothing
    // to read), and this stream waits for the peers' ready events. False:
    // the collective is staged, on every rank alike.
    bool open_direct(cuda::DeviceBufferRef mine, const void* own, std::vector<const char*>& srcs) {
      if (!ipc->direct) return false;
      in_direct = true;
      direct_step([&] { check(cudaEventRecord(ipc->ready[rank], ipc->stream), text); });
      if (!direct_error.empty()) mine.shareable = 0;  // then staged, where the error shows again
      std::vector<cuda::DeviceBufferRef> all(static_cast<size_t>(size));
      round->exchange(&mine, sizeof mine, all.data());
      for (const auto& r : all)
        if (!r.shareable) {
          in_direct = false;
          direct_error.clear();
          return false;
        }
      srcs.assign(static_cast<size_t>(size), nullptr);
      srcs[rank] = static_cast<const char*>(own);
      for (int q = 0; q < size; ++q)
        if (q != rank && all[q].handle_bytes > 0) direct_step([&] { srcs[q] = ipc->peer_inputs.data(q, all[q]); });
      wait_for_peers(ipc->ready);
      return true;
    }
    // An all-reduce's middle: this rank's slice is summed (its summed event
    // recorded behind the sum); a round; this stream then waits for the
    // peers' slices.
    void publish_summed() {
      direct_step([&] { check(cudaEventRecord(ipc->summed[rank], ipc->stream), text); });
      if (all_well()) wait_for_peers(ipc->summed);
    }
    // This rank's reads are done (its stream drained, within the collective
    // timeout: its work waits on other processes' events); the last round,
    // after which every peer's are too and each rank's input is its
    // caller's again. Throws on every rank if any failed.
    void close_direct() {
      bool drained = false;
      direct_step([&] {
        drain_within_timeout();
        drained = true;
      });
      // Mappings go while their owners still hold the inputs (before the round).
      if (drained && !ipc->cache_mappings) ipc->peer_inputs.close_all();
      const bool ok = all_well();
      in_direct = false;
      if (!ok) throw CommError(text + ": the direct path failed: " + direct_error);
      ipc->direct_ops.fetch_add(1, std::memory_order_relaxed);
    }
    // Tests (ZERO_TEST_CUDA_IPC_SUM_DELAY=cycles): rank 0's stream idles
    // before its all-reduce sum, so its peers' copies of its summed slice
    // must wait for its summed event to be right.
    void delay_rank0_for_testing() {
      static const int64_t cycles = [] {
        const char* v = std::getenv("ZERO_TEST_CUDA_IPC_SUM_DELAY");
        return v && *v ? std::atoll(v) : int64_t{0};
      }();
      if (cycles <= 0 || rank != 0) return;
      direct_step([&] {
        const c10::cuda::CUDAStreamGuard on_stream(ipc->stream);
        at::cuda::sleep(cycles);
      });
    }
    // On the device, not the host: the peers' latest records of `events`.
    void wait_for_peers(const std::vector<cudaEvent_t>& events) {
      for (int q = 0; q < size; ++q)
        if (q != rank) direct_step([&] { check(cudaStreamWaitEvent(ipc->stream, events[q], 0), text); });
    }
    void drain_within_timeout() {
      const auto deadline = std::chrono::steady_clock::now() + ipc->timeout;
      for (int polls = 0;; ++polls) {
        const cudaError_t err = cudaStreamQuery(ipc->stream);
        if (err == cudaSuccess) return;
        if (err != cudaErrorNotReady) check(err, text);
        if (std::chrono::steady_clock::now() > deadline)
          throw CommError(text + ": its device work did not finish within the collective timeout (" +
                          std::to_string(ipc->timeout.count()) + " ms; a peer's input never became ready?)");
        if (polls < 1000) std::this_thread::yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  };

  // Queues `body` on the group's lane for `op`, after the caller's stream's
  // work so far (an event recorded now, waited for by the IPC stream when
  // the body starts). The lane keeps `tensors` alive until it has run.
  template <typename Body>
  WorkHandle submit(const Group& g, CollectiveOp op, const char* name, const Signature& sig,
                    std::vector<at::Tensor> tensors, Body body) {
    const c10::Device device = tensors.front().device();
    auto ipc = group_state(g, op, device);
    auto ready = std::make_shared<at::cuda::CUDAEvent>();
    ready->record(c10::cuda::getCurrentCUDAStream(device.index()));
    const std::string text = sig.text + " on " + g.describe() + " (cuda ipc)";
    const int rank = g.rank(), size = g.size();
    auto keep = std::make_shared<const std::vector<at::Tensor>>(std::move(tensors));
    auto job = shm_lane(g, op)->external(
        name, make_signature_record(sig.text), keep,
        [ipc, ready, text, rank, size, body = std::move(body)](const shm::Lane::Handshake& round) {
          c10::cuda::CUDAGuard guard(ipc->device);
          ready->block(ipc->stream);
          Run run;
          run.ipc = ipc;
          run.rank = rank;
          run.size = size;
          run.text = text;
          run.round = &round;
          body(run);
          check(cudaStreamSynchronize(ipc->stream), text);  // done before the job reports done
        });
    return lane_work(std::move(job));
  }

  // Reduce-scatters have buffers of their own, as they have a lane of their
  // own: autograd's thread issues them while the main thread gathers.
  std::shared_ptr<CudaIpcGroup> group_state(const Group& g, CollectiveOp op, c10::Device device) {
    Group::Impl& impl = g.impl();
    std::lock_guard<std::mutex> lock(impl.device_backend_mu);
    const bool reduce = op == CollectiveOp::ReduceScatter;
    auto& state = reduce ? impl.cuda_ipc_reduce : impl.cuda_ipc;
    if (!state) state = make_ipc_group(g, device, reduce ? "reduce" : "main");
    if (state->device != device)
      throw CommError(g.describe() + ": CUDA IPC buffers are on " + state->device.str() +
                      ", this collective's tensors on " + device.str() + " (one device per rank)");
    return state;
  }
};

}  // namespace

std::shared_ptr<Transport> make_cuda_ipc_transport() { return std::make_shared<CudaIpcTransport>(); }

int64_t cuda_ipc_direct_collectives(const Group& g) {
  Group::Impl& impl = g.impl();
  std::lock_guard<std::mutex> lock(impl.device_backend_mu);
  int64_t n = 0;
  for (const auto& ipc : {impl.cuda_ipc, impl.cuda_ipc_reduce})
    if (ipc) n += ipc->direct_ops.load(std::memory_order_relaxed);
  return n;
}

}  // namespace zero::comm
