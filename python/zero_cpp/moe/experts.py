"""DeepSpeed's `deepspeed.moe.experts.Experts`: `num_local_experts` copies
of one expert module, each taking its slice of the dispatched tokens."""
import copy

import torch
from torch import nn


class Experts(nn.Module):
    """The experts of one MoE layer: deep copies of `expert` (so they start
    equal, as DeepSpeed's do), their params marked as expert params
    (`allreduce = False`, `group_name`) for the optimizer's param groups."""

    def __init__(self, expert, num_local_experts=1, expert_group_name=None):
        super().__init__()
        self.deepspeed_experts = nn.ModuleList(copy.deepcopy(expert) for _ in range(num_local_experts))
        self.num_local_experts = num_local_experts
        for e in self.deepspeed_experts:
            for p in e.parameters():
                p.allreduce = False
                p.group_name = expert_group_name

    def forward(self, inputs):
        """`inputs` [ep, experts, capacity, model]: expert i runs on its
        slice of dim 1; an expert returning (output, bias) gives its output."""
        outputs = []
        for chunk, expert in zip(inputs.chunk(self.num_local_experts, dim=1), self.deepspeed_experts):
            out = expert(chunk)
            outputs.append(out[0] if isinstance(out, tuple) else out)
        return torch.cat(outputs, dim=1)
