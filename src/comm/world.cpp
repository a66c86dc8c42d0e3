// Rendezvous (c10d TCPStore), the rank's device, process-group
// construction, and the world's shutdown.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <thread>

#include <unistd.h>

#include <ATen/DeviceAccelerator.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/fd_limit.h"
#include "comm/gloo_transport.h"
#include "comm/group_impl.h"
#include "comm/hierarchical_transport.h"
#include "comm/cuda_ipc_transport.h"
#include "comm/nccl_transport.h"
#include "comm/shm_transport.h"
#include "common/libstdcxx_binding.h"
#include "comm/work.h"
#include "zero/comm.h"

namespace zero::comm {

namespace {

std::chrono::milliseconds env_seconds(const char* name, std::chrono::milliseconds given) {
  if (given.count() > 0) return given;
  if (const char* v = std::getenv(name); v && *v) {
    char* end = nullptr;
    double s = std::strtod(v, &end);
    if (end == v || *end || s <= 0)
      throw std::runtime_error(std::string(name) + "=" + v + " is not a positive number of seconds");
    return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  }
  return std::chrono::seconds(300);
}

std::shared_ptr<::gloo::transport::Device> make_gloo_device(const LaunchEnv& env) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  // Single host (zero-run, or a loopback master): loopback needs no DNS.
  if (env.master_addr.empty() || env.master_addr == "localhost" || env.master_addr.rfind("127.", 0) == 0)
    return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// Every rank checks in, then waits until all have, so a missing rank is an
// error naming how many arrived instead of a hang in the first collective.
void wait_for_all_ranks(c10d::Store& store, int world_size, std::chrono::milliseconds timeout,
                        const std::string& where) {
  const std::string key = "zero_ranks_arrived";
  int64_t arrived = store.add(key, 1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (arrived < world_size) {
    if (std::chrono::steady_clock::now() > deadline)
      throw CommError("rendezvous: only " + std::to_string(arrived) + " of " +
                      std::to_string(world_size) + " ranks arrived within " +
                      std::to_string(timeout.count() / 1000) + " s (" + where +
                      ") -- are all ranks started?");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    arrived = store.add(key, 0);
  }
}

// The device a rank computes on, made current: the accelerator's device
// LOCAL_RANK mod the devices visible (several ranks on one GPU then share it
// through CUDA IPC), else the CPU. Every later allocation and launch that
// does not name its device lands there, as it does for a torchrun script
// that called torch.cuda.set_device(local_rank).
at::Device rank_device(const LaunchEnv& env, const std::optional<at::Device>& given) {
  if (given) {
    if (!given->is_cpu()) {
      const at::Device d = given->has_index() ? *given : at::Device(given->type(), 0);
      c10::impl::VirtualGuardImpl(d.type()).setDevice(d);
      return d;
    }
    return *given;
  }
  const auto accelerator = at::accelerator::getAccelerator(false);
  if (!accelerator) return at::kCPU;
  const c10::DeviceIndex count = at::accelerator::deviceCount();
  if (count <= 0) return at::kCPU;  // a CUDA build on a machine without a GPU
  const auto index = static_cast<c10::DeviceIndex>(env.local_rank % count);
  at::accelerator::setDeviceIndex(index);
  return at::Device(*accelerator, index);
}

}  // namespace

// Group::Impl::shutdown (comm/group_impl.h): what runs on the group's
// threads stops first, then the communicators those threads used.
void Group::Impl::shutdown() {
  if (shut_down_.exchange(true, std::memory_order_acq_rel)) return;
  hier.reset();  // its executors' threads; its sub-groups are the world's groups too, shut down on their own
  shm.reset();   // the lanes finish or fail what is queued (CUDA IPC's jobs run there), the segment goes
  cuda_ipc.reset();
  cuda_ipc_reduce.reset();
  lane.reset();  // Gloo's lane threads, before their backends
  reduce_lane.reset();
  {
    std::lock_guard<std::mutex> lock(device_backend_mu);
    for (auto* b : {&device_backend, &device_reduce_backend}) {
      if (*b) (*b)->shutdown();  // NCCL's communicators, while CUDA is still up
      b->reset();
    }
  }
  backend.reset();
  reduce_backend.reset();
}

namespace {

// The worlds alive in this process, shut down by an exit handler if the
// program never does it: a World in a static, or never freed, would
// otherwise outlive CUDA's teardown (NCCL's destructors then hang or crash).
// Never destroyed: the handler may run after other statics are gone.
struct LiveWorlds {
  std::mutex mu;
  std::vector<World*> worlds;
  pid_t pid = getpid();  // a child forked from a rank has copies without their threads: it leaves them be
};
LiveWorlds& live_worlds() {
  static auto* w = new LiveWorlds;
  return *w;
}

void shutdown_live_worlds() {
  std::vector<World*> worlds;
  {
    std::lock_guard<std::mutex> lock(live_worlds().mu);
    if (getpid() != live_worlds().pid) return;
    worlds = live_worlds().worlds;
  }
  for (auto it = worlds.rbegin(); it != worlds.rend(); ++it) (*it)->shutdown();
}

// Handlers run in the reverse order of their registration, CUDA's own among
// them: registered once the device is set (CUDA initialised), ours runs first.
void install_exit_handler() {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(shutdown_live_worlds); });
}

}  // namespace

struct World::Impl {
  LaunchEnv env;
  at::Device compute_device{at::kCPU};
  std::chrono::milliseconds collective_timeout;
  c10::intrusive_ptr<c10d::Store> store;
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<Group> world_group;
  Comm comm{std::make_shared<GlooTransport>()};
  int next_group_id = 0;
  // Every group made here (sub-groups of hierarchical ones too), in order.
  std::vector<std::shared_ptr<Group::Impl>> groups;
  std::mutex shutdown_mu;
  bool shut_down = false;

  void shutdown() {
    std::lock_guard<std::mutex> lock(shutdown_mu);
    if (shut_down) return;
    shut_down = true;
    for (auto it = groups.rbegin(); it != groups.rend(); ++it) (*it)->shutdown();  // sub-groups before their parent
  }

  std::string host_of(int rank) {
    auto v = store->get("zero_host_" + std::to_string(rank));
    return std::string(v.begin(), v.end());
  }

  std::shared_ptr<Group> make_group(const std::vector<int>& ranks, const std::string& name) {
    const int id = next_group_id++;  // advanced on every rank, member or not
    if (std::find(ranks.begin(), ranks.end(), env.rank) == ranks.end()) return nullptr;
    return make_group_at(ranks, name, "zero_group_" + std::to_string(id), true);
  }

  // A group this rank is a member of, its state under `prefix` in the store.
  std::shared_ptr<Group> make_group_at(const std::vector<int>& ranks, const std::string& name,
                                       const std::string& prefix, bool may_be_hierarchical) {
    const int group_rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), env.rank) - ranks.begin());
    auto opts = c10d::ProcessGroupGloo::Options::create(collective_timeout);
    opts->devices.push_back(device);
    auto lane = [&](const std::string& suffix) {
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix + suffix, store);
      return c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, group_rank, static_cast<int>(ranks.size()), opts);
    };
    auto impl = std::make_shared<Group::Impl>();
    groups.push_back(impl);
    try {
      impl->backend = lane("");
      impl->reduce_backend = lane("_reduce");
    } catch (const std::exception& e) {
      throw CommError("creating " + Group(name, ranks, group_rank, nullptr).describe() +
                      " failed: " + first_line(e.what()));
    }
    impl->timeout = collective_timeout;
    impl->store = c10::make_intrusive<c10d::PrefixStore>(prefix + "_device", store);
    impl->lane = std::make_unique<GlooLane>(impl->backend, collective_timeout);
    impl->reduce_lane = std::make_unique<GlooLane>(impl->reduce_backend, collective_timeout);
    auto group = std::make_shared<Group>(name, ranks, group_rank, impl);
    std::vector<std::string> hosts;
    for (int r : ranks) hosts.push_back(host_of(r));
    auto shm_store = c10::make_intrusive<c10d::PrefixStore>(prefix + "_shm", store);
    impl->shm = try_shm_group(*shm_store, shm_segment_prefix(env.job_id) + "-g" + prefix.substr(std::string("zero_group_").size()),
                              *group, hosts, collective_timeout);
    if (may_be_hierarchical && hierarchical_allowed_by_env())
      if (auto layout = host_layout(hosts)) impl->hier = make_hier_group(ranks, name, prefix, group_rank, *layout);
    return group;
  }

  // The sub-groups of a group spanning hosts: per lane, this host's ranks
  // and this local index's ranks; and one more of this host's ranks.
  std::shared_ptr<HierGroup> make_hier_group(const std::vector<int>& ranks, const std::string& name,
                                             const std::string& prefix, int group_rank, const HostLayout& layout) {
    auto h = std::make_shared<HierGroup>();
    h->layout = layout;
    h->host = layout.host_of[group_rank];
    h->local = layout.local_of[group_rank];
    auto global = [&](const std::vector<int>& group_ranks) {
      std::vector<int> out;
      for (int r : group_ranks) out.push_back(ranks[r]);
      return out;
    };
    const auto on_host = global(layout.ranks_on_host(h->host)), at_local = global(layout.ranks_at_local(h->local));
    const std::string host_tag = "h" + std::to_string(h->host), local_tag = "l" + std::to_string(h->local);
    for (int k = 0; k < 2; ++k) {
      const std::string lane = "_hier" + std::to_string(k);
      h->lanes[k].intra = make_group_at(on_host, name + ".host" + std::to_string(h->host), prefix + lane + host_tag, false);
      h->lanes[k].inter = make_group_at(at_local, name + ".local" + std::to_string(h->local), prefix + lane + local_tag, false);
    }
    h->host_local = make_group_at(on_host, name + ".host" + std::to_string(h->host), prefix + "_hpz" + host_tag, false);
    return h;
  }
};

World::World(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  std::lock_guard<std::mutex> lock(live_worlds().mu);
  live_worlds().worlds.push_back(this);
}

World::~World() {
  shutdown();
  std::lock_guard<std::mutex> lock(live_worlds().mu);
  auto& w = live_worlds().worlds;
  w.erase(std::remove(w.begin(), w.end(), this), w.end());
}

void World::shutdown() { impl_->shutdown(); }
bool World::is_shut_down() const {
  std::lock_guard<std::mutex> lock(impl_->shutdown_mu);
  return impl_->shut_down;
}

int World::rank() const { return impl_->env.rank; }
int World::size() const { return impl_->env.world_size; }
const LaunchEnv& World::env() const { return impl_->env; }
at::Device World::device() const { return impl_->compute_device; }
const Group& World::group() const { return *impl_->world_group; }
Comm& World::comm() { return impl_->comm; }

std::shared_ptr<Group> World::new_group(const std::vector<int>& ranks, const std::string& name) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty() || sorted.front() < 0 || sorted.back() >= size() ||
      std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    throw CommError("new_group '" + name + "': ranks must be distinct and in [0, " +
                    std::to_string(size()) + ")");
  return impl_->make_group(ranks, name);
}

std::shared_ptr<Group> World::split(int group_size, const std::string& name_prefix) {
  if (group_size < 1 || size() % group_size)
    throw CommError("split: group size " + std::to_string(group_size) +
                    " does not divide the world size " + std::to_string(size()));
  std::shared_ptr<Group> mine;
  for (int first = 0; first < size(); first += group_size) {
    std::vector<int> ranks(group_size);
    for (int i = 0; i < group_size; ++i) ranks[i] = first + i;
    auto g = new_group(ranks, name_prefix + std::to_string(first / group_size));
    if (g) mine = g;
  }
  return mine;
}

// A rank's stdout is a pipe (zero-run's, torchrun's, Slurm's): block
// buffered by the C library, so its printf lines would come out at exit, out
// of order with stderr, and be lost with a rank that is killed. Line
// buffered from here on, as a terminal is (torchrun's -u); what was printed
// before goes out now. ZERO_STDOUT_LINE_BUFFERED=0 keeps the C library's choice.
static void line_buffer_stdout() {
  const char* v = std::getenv("ZERO_STDOUT_LINE_BUFFERED");
  if (v && std::string(v) == "0") return;
  std::fflush(stdout);
  std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
}

std::shared_ptr<World> init_distributed(const DistributedOptions& opts) {
  static std::once_flag stdout_set;
  std::call_once(stdout_set, line_buffer_stdout);
  static std::once_flag binding_checked;  // a program linked with torch's libraries before libstdc++
  std::call_once(binding_checked, [] {
    if (const std::string w = std_filesystem_binding_warning(); !w.empty()) std::fprintf(stderr, "%s\n", w.c_str());
  });
  auto impl = std::make_unique<World::Impl>();
  impl->env = read_launch_env();
  const LaunchEnv& env = impl->env;
  impl->compute_device = rank_device(env, opts.device);
  install_exit_handler();  // after the device is set: see install_exit_handler
  static std::once_flag fd_limit_raised;
  std::call_once(fd_limit_raised, [] { raise_fd_limit(); });
  const auto rendezvous_timeout = env_seconds("ZERO_RENDEZVOUS_TIMEOUT_S", opts.rendezvous_timeout);
  impl->collective_timeout = env_seconds("ZERO_COLLECTIVE_TIMEOUT_S", opts.collective_timeout);

  if (env.world_size == 1 && env.master_addr.empty()) {
    impl->store = c10::make_intrusive<c10d::HashStore>();
  } else {
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(env.master_port);
    so.isServer = env.rank == 0 && !opts.join_existing_store;
    so.numWorkers = env.world_size;
    so.waitWorkers = false;  // we wait ourselves, with a deadline and a count (below)
    so.timeout = rendezvous_timeout;
    const std::string where = "rank " + std::to_string(env.rank) + " of " +
                              std::to_string(env.world_size) + ", " + env.launcher + " environment";
    try {
      impl->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
      // Beside torch.distributed's keys in its store: ours under a prefix,
      // one per torchrun restart (its agent's store outlives the workers it
      // restarts, as torch's own keys' /attempt_N prefix says).
      if (opts.join_existing_store) {
        const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
        impl->store = c10::make_intrusive<c10d::PrefixStore>(
            std::string("zero_cpp") + (attempt && *attempt ? std::string("/attempt_") + attempt : ""), impl->store);
      }
    } catch (const std::exception& e) {
      throw CommError("rendezvous at MASTER_ADDR=" + env.master_addr + " MASTER_PORT=" +
                      std::to_string(env.master_port) + " failed within " +
                      std::to_string(rendezvous_timeout.count() / 1000) + " s (" + where +
                      "): " + first_line(e.what()) +
                      (env.rank == 0 ? " -- are all ranks started?"
                                     : " -- is rank 0 running and the address/port right?"));
    }
    // Two processes launched with the same rank would otherwise hang in the
    // first collective; catch it here.
    if (impl->store->add("zero_rank_claims_" + std::to_string(env.rank), 1) > 1)
      throw CommError("rendezvous: two processes claim rank " + std::to_string(env.rank) + " (" +
                      where + ")");
    wait_for_all_ranks(*impl->store, env.world_size, rendezvous_timeout, where);
  }
  // Same-host groups use shared memory (see comm/shm_transport.h).
  const std::string host = host_identity();
  impl->store->set("zero_host_" + std::to_string(env.rank), std::vector<uint8_t>(host.begin(), host.end()));
  impl->comm.add_fast_path(std::make_shared<ShmTransport>());
  // Groups spanning hosts: inside each host, then across (comm/hierarchical_transport.h).
  impl->comm.add_fast_path(std::make_shared<HierarchicalTransport>());
  // CUDA tensors: NCCL, when built with CUDA (comm/nccl_transport.h).
  if (auto nccl = make_nccl_transport()) impl->comm.set_device_transport(c10::DeviceType::CUDA, std::move(nccl));
  // Ranks sharing a GPU on one host: CUDA IPC (comm/cuda_ipc_transport.h).
  if (auto ipc = make_cuda_ipc_transport()) impl->comm.add_device_fast_path(c10::DeviceType::CUDA, std::move(ipc));
  impl->device = make_gloo_device(env);
  std::vector<int> all(env.world_size);
  for (int r = 0; r < env.world_size; ++r) all[r] = r;
  impl->world_group = impl->make_group(all, "world");
  return std::make_shared<World>(std::move(impl));
}

}  // namespace zero::comm
