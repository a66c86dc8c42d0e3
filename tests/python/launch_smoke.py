"""A few stage-3 steps on whatever ranks the launcher started; rank 0
prints "losses: ..." (the launchers test compares them across launchers)
and each rank its place ("rank R of N, local L")."""
import torch
import torch.distributed as dist

import zero_cpp as deepspeed

deepspeed.init_distributed()
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                            torch.nn.Linear(32, 1))
cfg = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
       "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
       "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
print(f"rank {engine.global_rank} of {engine.world_size}, local {engine.local_rank}", flush=True)
losses = []
for step in range(4):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(4 * engine.world_size, 8, generator=g)[4 * engine.global_rank:4 * (engine.global_rank + 1)]
    loss = (engine(x) - x.sum(1, keepdim=True)).pow(2).mean()
    engine.backward(loss)
    engine.step()
    t = loss.detach().clone()
    dist.all_reduce(t)
    losses.append(f"{t.item() / engine.world_size:.6f}")
if engine.global_rank == 0:
    print("losses:", " ".join(losses), flush=True)
