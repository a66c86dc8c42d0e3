"""Gloo's native flat allgather and reduce-scatter (libtorch 2.x) against
what zero-cpp's Gloo backend does instead (allgather into per-rank views;
all-to-all, then a local sum in rank order), 2 ranks, fp32, 1 thread each.
Median ms per call, as JSON. docs/collectives.md's table cites it.

    PYTHON bench/gloo_native_ops.py     (PYTHON: the torch environment's)
"""
import os, time, json, torch, torch.distributed as dist
def t(f, reps):
    f(); dist.barrier()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); f(); ts.append(time.perf_counter() - t0)
    ts.sort(); return ts[len(ts) // 2]
def run(rank):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29541")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    N = 2; res = []
    for kib in [64, 1024, 4096, 16384, 65536]:
        n = kib * 256  # fp32 elements of the full buffer
        full = torch.randn(n); shard = torch.empty(n // N); reps = 20 if kib <= 4096 else 5
        out_full = torch.empty(n)
        native_ag = t(lambda: dist.all_gather_into_tensor(out_full, shard), reps)
        views = list(out_full.chunk(N))
        list_ag = t(lambda: dist.all_gather(views, shard), reps)
        native_rs = t(lambda: dist.reduce_scatter_tensor(shard, full), reps)
        recv = torch.empty(n)
        def a2a():
            dist.all_to_all_single(recv, full)
            acc = recv.view(N, -1)[0].clone()
            for r in range(1, N): acc.add_(recv.view(N, -1)[r])
        a2a_rs = t(a2a, reps)
        res.append(dict(kib=kib, allgather_native_ms=native_ag*1e3, allgather_views_ms=list_ag*1e3,
                        reduce_scatter_native_ms=native_rs*1e3, reduce_scatter_alltoall_ms=a2a_rs*1e3))
    if rank == 0: print(json.dumps(res, indent=1))
    dist.destroy_process_group()
if __name__ == "__main__":
    import torch.multiprocessing as mp; mp.spawn(run, nprocs=2)
