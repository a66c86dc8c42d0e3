"""DeepSpeed's `deepspeed.moe.layer.MoE`: a mixture-of-experts layer made
from one expert module, returning `(output, l_aux, exp_counts)`.

    self.fc3 = deepspeed.moe.layer.MoE(hidden_size=84, expert=nn.Linear(84, 84), num_experts=8, k=1)
    x, l_aux, _ = self.fc3(x)          # add a multiple of l_aux to the loss to balance the experts

Every rank holds every expert (`ep_size` 1): zero_cpp is data parallel, and
the experts' grads are averaged over the ranks as every other param's, as
DeepSpeed averages them at ep_size 1. Expert parallelism (`ep_size` > 1:
each rank holds num_experts / ep_size experts, tokens exchanged
all-to-all) is refused, naming it. At stage 3 each expert is a unit of its
own (DeepSpeed's own MoE refuses stage 3).
"""
from torch import nn
import torch.nn.functional as F

from .experts import Experts
from .sharded_moe import MOELayer, TopKGate


class MoE(nn.Module):
    """DeepSpeed's arguments and defaults: `num_experts` copies of `expert`
    (which must take and return `hidden_size` features), a top-`k` gate (1,
    2 or more), each expert's capacity `capacity_factor` (training) or
    `eval_capacity_factor` times its fair share of the tokens, at least
    `min_capacity`; `drop_tokens=False` gives every expert room for all its
    tokens; `use_rts` keeps a random subset of an over-full expert's tokens
    (else the first ones); `noisy_gate_policy` "Jitter" (input noise) or
    "RSample" (Gumbel noise on the top-1 choice); `use_residual`: the
    Residual MoE, the layer's output mixed with `expert`'s own by a learned
    coefficient."""

    def __init__(self, hidden_size, expert, num_experts=1, ep_size=1, k=1, capacity_factor=1.0,
                 eval_capacity_factor=1.0, min_capacity=4, use_residual=False, noisy_gate_policy=None,
                 drop_tokens=True, use_rts=True, use_tutel=False, enable_expert_tensor_parallelism=False,
                 top2_2nd_expert_sampling=True):
        super().__init__()
        if num_experts % ep_size != 0:
            raise AssertionError(f"MoE: num_experts ({num_experts}) is not divisible by ep_size ({ep_size})")
        if ep_size != 1:
            raise NotImplementedError(
                f"zero_cpp MoE: ep_size {ep_size} asks for expert parallelism (each rank holding num_experts / "
                "ep_size experts, tokens exchanged all-to-all), which zero_cpp does not have: it is data parallel. "
                "Use ep_size=1: every rank holds every expert")
        if noisy_gate_policy not in (None, "None", "Jitter", "RSample"):
            raise AssertionError(f"MoE: unsupported noisy_gate_policy {noisy_gate_policy!r} (None, 'Jitter' or "
                                 "'RSample')")
        self.use_residual = use_residual
        self.enable_expert_tensor_parallelism = enable_expert_tensor_parallelism
        self.ep_size, self.num_experts = ep_size, num_experts
        self.expert_group_name = f"ep_size_{ep_size}"
        self.num_local_experts = num_experts // ep_size
        # Built in DeepSpeed's order (the experts copied, then the gate's and
        # the coefficient's init draws), so a seed gives DeepSpeed's weights.
        experts = Experts(expert, self.num_local_experts, self.expert_group_name)
        gate = TopKGate(hidden_size, num_experts, k, capacity_factor, eval_capacity_factor, min_capacity,
                        noisy_gate_policy, drop_tokens, use_rts, None, top2_2nd_expert_sampling)
        self.deepspeed_moe = MOELayer(gate, experts, self.expert_group_name, ep_size, self.num_local_experts,
                                      use_tutel=use_tutel)
        if use_residual:
            self.mlp = expert
            self.coefficient = nn.Linear(hidden_size, 2)

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_=False):
        """DeepSpeed's engine makes the expert-parallel groups here; at
        ep_size 1 there are none to make."""

    def forward(self, hidden_states, used_token=None):
        output = self.deepspeed_moe(hidden_states, used_token)
        if self.use_residual:
            residual = self.mlp(hidden_states)
            if isinstance(residual, tuple):
                residual = residual[0]
            coef = F.softmax(self.coefficient(hidden_states), dim=-1)
            output = output * coef[..., 0:1] + residual * coef[..., 1:]
        return output, self.deepspeed_moe.l_aux, self.deepspeed_moe.exp_counts
