#include "comm/device_placement.h"

#include <map>

namespace zero::comm {

CudaRoute choose_cuda_route(const std::vector<RankGpu>& ranks, bool ipc_allowed) {
  // The first pair of ranks on one GPU, if any (a UUID names one GPU
  // whatever host or namespace a rank sees it from).
  std::map<std::string, int> first_on;
  int a = -1, b = -1;
  bool one_host = true;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
    one_host = one_host && ranks[r].host == ranks[0].host;
    auto [it, fresh] = first_on.emplace(ranks[r].gpu, r);
    if (!fresh && a < 0) a = it->second, b = r;
  }
  using Via = CudaRoute::Via;
  if (a < 0) return {Via::Nccl, "NCCL: each rank has a GPU of its own"};
  const std::string pair = "ranks " + std::to_string(a) + " and " + std::to_string(b) + " share GPU " + ranks[a].gpu;
  if (!one_host)
    return {Via::Neither, "CUDA collectives: " + pair + ", and the group spans hosts: NCCL refuses two ranks on one "
                          "GPU and CUDA IPC serves one host only (give each rank its own GPU: CUDA_VISIBLE_DEVICES, or "
                          "fewer ranks per host)"};
  if (!ipc_allowed)
    return {Via::Neither, "CUDA collectives: " + pair + " and ZERO_CUDA_IPC=off: NCCL refuses two ranks on one GPU "
                          "(let CUDA IPC serve them, or give each rank its own GPU)"};
  return {Via::CudaIpc, "CUDA IPC: " + pair + " (NCCL refuses two ranks on one GPU)"};
}

}  // namespace zero::comm
