#include "comm/shm_transport.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "comm/env_switch.h"
#include "comm/group_impl.h"
#include "comm/shm/lane.h"
#include "comm/shm/peer_buffers.h"
#include "comm/shm/segment.h"
#include "comm/work.h"
#include "memory/page_buffer.h"

namespace zero::comm {

struct ShmGroup {
  shm::Segment segment;
  std::unique_ptr<shm::Lane> main;    // allgather, all-reduce, broadcast
  std::unique_ptr<shm::Lane> reduce;  // reduce-scatter
};

namespace {

// One slot per rank and buffer: big enough to amortize the per-round
// handshake, small enough to stay in cache and pipeline, and to keep a
// group's segment (2 lanes x 2 buffers x ranks slots: 4 MiB for 2 ranks)
// well inside Docker's default 64 MiB /dev/shm. 1 MiB measured no faster.
int64_t slot_bytes() {
  const char* s = std::getenv("ZERO_SHM_SLOT_BYTES");
  int64_t v = s && *s ? std::atoll(s) : (512 << 10);
  if (v < 4096) v = 4096;
  return v & ~int64_t{63};
}

std::string get(c10d::Store& store, const std::string& key) {
  auto v = store.get(key);
  return std::string(v.begin(), v.end());
}

void set(c10d::Store& store, const std::string& key, const std::string& value) {
  store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

shm::Lane::KeepAlive keep_alive(std::vector<at::Tensor> tensors) {
  return std::make_shared<const std::vector<at::Tensor>>(std::move(tensors));
}

ShmGroup& shm_of(const Group& g) { return *g.impl().shm; }

// Where a peer finds `t` (zero-copy), if in a shared flat buffer.
shm::BufferRef ref_of(const at::Tensor& t) {
  const auto pages = memory::shared_pages(t);
  if (!pages) return {};
  return shm::BufferRef{static_cast<int32_t>(getpid()), pages->fd, pages->inode, pages->map_offset,
                       pages->map_bytes, pages->offset};
}

// Whether every member can map the others' shared buffers: each publishes a
// small probe buffer and tries its peers'. Collective over the group's store;
// the same answer on every member. Off with ZERO_COMM_ZERO_COPY=off.
bool agree_zero_copy(c10d::Store& store, const Group& g) {
  const at::Tensor probe = memory::zeros_flat(4096, at::kByte);
  shm::BufferRef mine = env_switch_on("ZERO_COMM_ZERO_COPY") ? ref_of(probe) : shm::BufferRef{};
  set(store, "probe_" + std::to_string(g.rank()),
      std::to_string(mine.pid) + " " + std::to_string(mine.fd) + " " + std::to_string(mine.inode) + " " +
          std::to_string(mine.map_offset) + " " + std::to_string(mine.map_bytes));
  std::string status = mine.shareable() ? "ok" : "off";
  for (int q = 0; q < g.size() && status == "ok"; ++q) {
    if (q == g.rank()) continue;
    shm::BufferRef theirs;
    std::istringstream(get(store, "probe_" + std::to_string(q))) >> theirs.pid >> theirs.fd >> theirs.inode >>
        theirs.map_offset >> theirs.map_bytes;
    std::string why;
    if (!theirs.shareable()) status = "off";
    else if (!shm::PeerBuffers::can_map(theirs, &why)) status = "fail:" + why;
  }
  set(store, "zero_copy_" + std::to_string(g.rank()), status);
  std::string verdict = "ok";
  for (int q = 0; q < g.size(); ++q) {  // after this, no member opens `probe` any more
    const std::string s = get(store, "zero_copy_" + std::to_string(q));
    if (s != "ok" && verdict == "ok") verdict = s;
  }
  if (g.rank() == 0 && verdict.rfind("fail:", 0) == 0)
    std::fprintf(stderr, "zero-cpp: warning: zero-copy collectives unavailable for %s (%s); staging them\n",
                 g.describe().c_str(), verdict.substr(5).c_str());
  return verdict == "ok";
}

}  // namespace

std::optional<shm::Elem> reducible_elem(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return shm::Elem::F32;
    case at::kDouble: return shm::Elem::F64;
    case at::kBFloat16: return shm::Elem::BF16;
    case at::kHalf: return shm::Elem::F16;
    default: return std::nullopt;
  }
}

// The caller's handle on a queued collective. The lane itself keeps the
// tensors alive until the collective has run (see keep_alive).
namespace {
class ShmWork : public Work {
 public:
  explicit ShmWork(std::shared_ptr<shm::Job> job) : job_(std::move(job)) {}
  void wait() override {
    try {
      job_->wait();
    } catch (const shm::Mismatch& e) {
      throw CollectiveMismatch(e.what());
    } catch (const std::exception& e) {
      throw CommError(e.what());
    }
  }
  bool is_completed() override { return job_->done(); }

 private:
  std::shared_ptr<shm::Job> job_;
};
}  // namespace

WorkHandle lane_work(std::shared_ptr<shm::Job> job) { return std::make_shared<ShmWork>(std::move(job)); }

shm::Lane* shm_lane(const Group& g, CollectiveOp op) {
  const auto& s = g.impl().shm;
  if (!s) return nullptr;
  return op == CollectiveOp::ReduceScatter ? s->reduce.get() : s->main.get();
}

bool shm_fast_path_allowed_by_env() { return env_switch_on("ZERO_COMM_FASTPATH"); }

int64_t shm_zero_copy_collectives(const Group& g) {
  const auto& s = g.impl().shm;
  return s ? s->main->zero_copy_collectives() + s->reduce->zero_copy_collectives() : 0;
}

bool shm_zero_copy(const Group& g) {
  const auto& s = g.impl().shm;
  return s && s->main->zero_copy();
}

std::string host_identity() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  // The network namespace too: ranks in different ones reach each other only
  // over the network, as on different hosts (how the multi-host tests
  // simulate hosts; containers with their own network count as hosts too).
  char ns[64] = {};
  if (readlink("/proc/self/ns/net", ns, sizeof(ns) - 1) < 0) ns[0] = '\0';
  return std::string(name) + "/" + boot + "/" + ns;
}

std::shared_ptr<ShmGroup> try_shm_group(c10d::Store& store, const std::string& segment_prefix, const Group& g,
                                        const std::vector<std::string>& member_hosts,
                                        std::chrono::milliseconds timeout) {
  if (g.size() < 2 || g.size() > shm::Lane::kMaxRanks) return nullptr;
  for (const auto& h : member_hosts)
    if (h != member_hosts.front()) return nullptr;  // the same answer on every member

  const int64_t slot = slot_bytes();
  const size_t lane_bytes = shm::Lane::region_bytes(g.size(), slot);
  // The creator's pid makes the name unique even when a job id is reused.
  std::string path = shm::Segment::directory() + "/" + segment_prefix + "-p" + std::to_string(getpid());
  const bool allowed = shm_fast_path_allowed_by_env();
  auto group = std::make_shared<ShmGroup>();
  // If the agreement below throws (a peer died, the store timed out), the
  // creator still removes the name: nothing is left in /dev/shm.
  struct UnlinkOnError {
    const std::string& path;
    bool armed;
    ~UnlinkOnError() {
      if (armed) shm::Segment::unlink(path);
    }
  } unlink_on_error{path, false};
  std::string status = allowed ? "ok" : "off";
  if (g.rank() == 0) {
    if (allowed) {
      try {
        group->segment = shm::Segment::create(path, 2 * lane_bytes);
        unlink_on_error.armed = true;
        shm::Lane::format(group->segment.data(), g.size(), slot);
        shm::Lane::format(static_cast<char*>(group->segment.data()) + lane_bytes, g.size(), slot);
      } catch (const std::exception& e) {
        status = std::string("fail:") + e.what();
      }
    }
    set(store, "segment", path);
    set(store, "created", status);
  } else {
    const std::string created = get(store, "created");
    path = get(store, "segment");
    if (created != "ok") {
      status = allowed ? created : "off";
    } else if (allowed) {
      try {
        group->segment = shm::Segment::open(path, 2 * lane_bytes);
      } catch (const std::exception& e) {
        status = std::string("fail:") + e.what();
      }
    }
  }
  set(store, "mapped_" + std::to_string(g.rank()), status);
  std::string verdict = "ok";
  for (int q = 0; q < g.size(); ++q) {
    const std::string s = get(store, "mapped_" + std::to_string(q));
    if (s != "ok" && verdict == "ok") verdict = s;
  }
  if (g.rank() == 0) shm::Segment::unlink(path);  // every member has opened it, or given up
  unlink_on_error.armed = false;
  if (verdict != "ok") {
    if (g.rank() == 0 && verdict.rfind("fail:", 0) == 0) {
      static std::once_flag warned;
      std::call_once(warned, [&] {
        std::fprintf(stderr, "zero-cpp: warning: shared-memory transport unavailable for %s (%s); using Gloo\n",
                     g.describe().c_str(), verdict.substr(5).c_str());
      });
    }
    return nullptr;
  }
  const bool zero_copy = agree_zero_copy(store, g);
  char* base = static_cast<char*>(group->segment.data());
  group->main = std::make_unique<shm::Lane>(base, g.rank(), g.size(), slot, timeout, g.describe(), zero_copy);
  group->reduce =
      std::make_unique<shm::Lane>(base + lane_bytes, g.rank(), g.size(), slot, timeout, g.describe(), zero_copy);
  shm::Lane::pair(*group->main, "allgather and all-reduce", *group->reduce, "reduce-scatter");
  return group;
}

// ---- the transport ---------------------------------------------------------------

bool ShmTransport::supports(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t) const {
  if (!g.impl().shm) return false;
  switch (op) {
    case CollectiveOp::AllGather:
    case CollectiveOp::Broadcast: return true;
    case CollectiveOp::ReduceScatter:
    case CollectiveOp::AllReduce: return reducible_elem(dtype).has_value();
    default: return false;
  }
}

int64_t ShmTransport::wire_bytes(const Group& g, CollectiveOp op, at::ScalarType dtype, int64_t numel) const {
  // What this rank copies into the shared segment.
  const int64_t elem = static_cast<int64_t>(c10::elementSize(dtype));
  return op == CollectiveOp::AllGather ? numel / g.size() * elem : numel * elem;
}

WorkHandle ShmTransport::all_gather(const Group& g, at::Tensor out_flat, at::Tensor in_shard, const Signature& sig) {
  // Any dtype travels as bytes; only a widening gather needs element types.
  const bool widen = out_flat.scalar_type() != in_shard.scalar_type();
  const shm::Elem in_type = widen ? *reducible_elem(in_shard.scalar_type()) : shm::Elem::Bytes;
  const shm::Elem out_type = widen ? shm::Elem::F32 : shm::Elem::Bytes;
  const int64_t shard_numel = widen ? in_shard.numel() : static_cast<int64_t>(in_shard.nbytes());
  return lane_work(shm_of(g).main->all_gather(out_flat.data_ptr(), out_type, in_shard.data_ptr(),
                                                              in_type, shard_numel, make_signature_record(sig.text),
                                                              keep_alive({out_flat, in_shard}), ref_of(in_shard)));
}

WorkHandle ShmTransport::reduce_scatter(const Group& g, at::Tensor out_shard, at::Tensor in_flat, ReduceOp op,
                                        const Signature& sig) {
  return lane_work(shm_of(g).reduce->reduce_scatter(
      out_shard.data_ptr(), *reducible_elem(out_shard.scalar_type()), in_flat.data_ptr(),
      *reducible_elem(in_flat.scalar_type()), out_shard.numel(), op == ReduceOp::Avg, make_signature_record(sig.text),
      keep_alive({out_shard, in_flat}), ref_of(in_flat)));
}

WorkHandle ShmTransport::all_reduce(const Group& g, at::Tensor t, ReduceOp op, const Signature& sig) {
  return lane_work(shm_of(g).main->all_reduce(t.data_ptr(), *reducible_elem(t.scalar_type()), t.numel(),
                                                              op == ReduceOp::Avg, make_signature_record(sig.text),
                                                              keep_alive({t}), ref_of(t)));
}

WorkHandle ShmTransport::broadcast(const Group& g, at::Tensor t, int root, const Signature& sig) {
  return lane_work(shm_of(g).main->broadcast(t.data_ptr(), static_cast<int64_t>(t.nbytes()), root,
                                                             make_signature_record(sig.text), keep_alive({t})));
}

WorkHandle ShmTransport::barrier(const Group& g, const Signature&) {
  throw CommError("barrier on " + g.describe() + ": not served by the shared-memory transport");
}

}  // namespace zero::comm
