"""DeepSpeed's `deepspeed.moe.sharded_moe`: the top-k gate (GShard's, with
DeepSpeed's capacity, token dropping, random token selection and noise) and
the layer that sends each token to its experts and weighs their outputs.

Every rank holds every expert here (expert parallelism, `ep_size` > 1, is
not built), so there is no all-to-all: tokens go to their experts' slots in
this rank's buffer. The gate draws its random numbers (random token
selection, the second expert's Gumbel sampling, the noise policies) from
torch's generator in DeepSpeed's order and shapes, so a seeded run routes
every token as DeepSpeed's does and the losses are DeepSpeed's
(`python_parity` "moe").

A gate's routes are `Routes`: for each of the k routes of each of the S
tokens, its expert (-1 where capacity dropped it), its slot within that
expert's `capacity`, and its weight.
"""
import collections

import torch
import torch.nn.functional as F
from torch import nn

Routes = collections.namedtuple("Routes", "l_aux capacity num_experts experts slots weights exp_counts")


def _uniform(shape, low, high, device):
    return torch.distributions.uniform.Uniform(torch.tensor(low, device=device),
                                               torch.tensor(high, device=device)).rsample(shape)


def gumbel_rsample(shape, device):
    """Standard Gumbel noise (the second expert's sampling, the RSample policy)."""
    return torch.distributions.gumbel.Gumbel(torch.tensor(0.0, device=device),
                                             torch.tensor(1.0, device=device)).rsample(shape)


def multiplicative_jitter(x, device, epsilon=1e-2):
    """`x` times noise drawn uniformly from [1 - epsilon, 1 + epsilon)
    (the "Jitter" noisy gate policy, on the gate's input)."""
    return x if epsilon == 0 else x * _uniform(x.shape, 1.0 - epsilon, 1.0 + epsilon, device)


def _capacity(num_tokens, num_experts, capacity_factor, min_capacity):
    """Slots per expert: the tokens' fair share times the factor, rounded
    up, at least min_capacity (a 0-dim int64 tensor)."""
    capacity = torch.ceil((num_tokens / num_experts) * torch.tensor(capacity_factor)).to(torch.int64)  # in fp32
    return torch.maximum(capacity, torch.tensor(min_capacity).to(torch.int64))


def _no_drop_capacity(exp_counts):
    """Without token dropping: as many slots as the busiest expert's tokens."""
    return torch.max(exp_counts)


def top1_routes(logits, capacity_factor, min_capacity, used_token=None, noisy_gate_policy=None, drop_tokens=True,
                use_rts=True):
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    capacity = _capacity(num_tokens, num_experts, capacity_factor, min_capacity)
    chooser = logits + gumbel_rsample(logits.shape, logits.device) if noisy_gate_policy == "RSample" else gates
    experts = torch.argmax(chooser, dim=1)
    mask = F.one_hot(experts, num_classes=num_experts)
    if used_token is not None:
        mask = torch.einsum("s,se->se", used_token, mask)
    exp_counts = torch.sum(mask, dim=0).detach().to(logits.device)
    if not drop_tokens:
        capacity = min(_no_drop_capacity(exp_counts), torch.tensor(num_tokens))
    l_aux = torch.sum(torch.mean(gates, dim=0) * torch.mean(mask.float(), dim=0)) * num_experts
    # Which of an expert's tokens keep their slot: at random (random token
    # selection), else the first ones.
    ranked = mask * _uniform(mask.shape, 0.0, 1.0, logits.device) if use_rts else mask
    if num_tokens < min_capacity:
        raise AssertionError(f"MoE top-1 gate: {num_tokens} tokens, fewer than min_capacity ({min_capacity}); "
                             "set min_capacity lower or give more tokens")
    kept = torch.topk(ranked, k=min(capacity, torch.tensor(num_tokens)), dim=0)[1]
    mask = mask * torch.zeros_like(mask).scatter_(0, kept, 1)
    experts = torch.min(experts, mask.sum(dim=1) * num_experts - 1)  # -1: dropped
    slots = torch.sum((torch.cumsum(mask, dim=0) - 1) * mask, dim=1)
    weights = (gates * mask).sum(dim=1)
    return Routes(l_aux, capacity, num_experts, experts.to(torch.int32).unsqueeze(0),
                  slots.to(torch.int32).unsqueeze(0), weights.unsqueeze(0), exp_counts)


def top2_routes(logits, capacity_factor, min_capacity, drop_tokens=True, second_expert_sampling=True):
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    first = torch.argmax(gates, dim=1)
    mask1 = F.one_hot(first, num_classes=num_experts)
    if second_expert_sampling:
        logits = logits + gumbel_rsample(logits.shape, logits.device)
    second = torch.argmax(logits.masked_fill(mask1.bool(), float("-inf")), dim=1)
    mask2 = F.one_hot(second, num_classes=num_experts)
    slots1 = torch.cumsum(mask1, dim=0) - 1
    slots2 = torch.cumsum(mask2, dim=0) - 1 + torch.sum(mask1, dim=0, keepdim=True)  # after every first choice
    l_aux = torch.mean(torch.mean(gates, dim=0) * torch.mean(mask1.float(), dim=0)) * num_experts * num_experts
    exp_counts = torch.sum(mask1 + mask2, dim=0).detach().to(logits.device)
    if drop_tokens:
        capacity = _capacity(num_tokens, num_experts, capacity_factor * 2, min_capacity)
        mask1 = mask1 * torch.lt(slots1, capacity)
        mask2 = mask2 * torch.lt(slots2, capacity)
    else:
        capacity = _no_drop_capacity(exp_counts)
    w1 = torch.einsum("se,se->s", gates, mask1.float())
    w2 = torch.einsum("se,se->s", gates, mask2.float())
    denom = torch.clamp(w1 + w2, min=torch.finfo(w1.dtype).eps)
    w1, w2 = w1 / denom, w2 / denom
    first = torch.where(mask1.any(dim=1), first, torch.full_like(first, -1))
    second = torch.where(mask2.any(dim=1), second, torch.full_like(second, -1))
    slots = torch.stack([torch.sum(slots1 * mask1, dim=1), torch.sum(slots2 * mask2, dim=1)])
    return Routes(l_aux, capacity, num_experts, torch.stack([first, second]).to(torch.int32),
                  slots.to(torch.int32), torch.stack([w1, w2]), exp_counts)


def topk_routes(logits, k, capacity_factor, min_capacity, drop_tokens=True):
    """k > 2: each token's k likeliest experts; past capacity an expert
    keeps the tokens that chose it with the highest gate values."""
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    top_gate, top_idx = torch.topk(gates, k=k, dim=1)
    mask = torch.zeros_like(gates, dtype=torch.bool).scatter_(1, top_idx, 1)
    exp_counts = torch.sum(mask, dim=0).detach().to(logits.device)
    l_aux = torch.mean(torch.mean(gates, dim=0) * torch.mean(mask.float(), dim=0)) * num_experts * num_experts / k
    if drop_tokens:
        capacity = _capacity(num_tokens, num_experts, capacity_factor * k, min_capacity)
        chosen = torch.zeros_like(gates).scatter(1, top_idx, top_gate)
        _, kept = torch.topk(chosen, k=min(capacity, torch.tensor(num_tokens)), dim=0, sorted=False)
        mask &= torch.zeros_like(gates, dtype=torch.bool).scatter_(0, kept, True)
    else:
        capacity = _no_drop_capacity(exp_counts)
    slots = torch.cumsum(mask, dim=0) - 1
    weights = gates * mask
    weights = weights / torch.clamp(torch.sum(weights, dim=-1, keepdim=True), min=torch.finfo(weights.dtype).eps)
    kept = mask.gather(1, top_idx)
    experts = torch.where(kept, top_idx, torch.full_like(top_idx, -1))
    return Routes(l_aux, capacity, num_experts, experts.t().contiguous().to(torch.int32),
                  (slots.gather(1, top_idx) * kept).t().contiguous().to(torch.int32),
                  weights.gather(1, top_idx).t().contiguous(), exp_counts)


class TopKGate(nn.Module):
    """The gate: a bias-free Linear (`wg`) scoring each token for each
    expert, in fp32; its forward gives the tokens' `Routes` (training uses
    `capacity_factor` and the noise policy, eval `eval_capacity_factor` and
    none)."""

    def __init__(self, model_dim, num_experts, k=1, capacity_factor=1.0, eval_capacity_factor=1.0, min_capacity=8,
                 noisy_gate_policy=None, drop_tokens=True, use_rts=True, ep_group=None,
                 top2_2nd_expert_sampling=True):
        super().__init__()
        self.wg = nn.Linear(model_dim, num_experts, bias=False)
        self.ep_group = ep_group
        self.k, self.capacity_factor, self.eval_capacity_factor = k, capacity_factor, eval_capacity_factor
        self.min_capacity, self.noisy_gate_policy = min_capacity, noisy_gate_policy
        self.drop_tokens, self.use_rts, self.top2_2nd_expert_sampling = drop_tokens, use_rts, top2_2nd_expert_sampling
        self.wall_clock_breakdown = False
        self.gate_time = 0.0

    def _set_ep_group(self, ep_group):
        self.ep_group = ep_group

    def forward(self, input, used_token=None, sparse_routes=False, use_tutel=False):
        """The tokens' `Routes` with `sparse_routes` (the MoE layer's call);
        else DeepSpeed's dense form, (l_aux, combine_weights [S, E, C],
        dispatch_mask, exp_counts)."""
        routes = self._routes(input, used_token)
        return routes if sparse_routes else _dense(routes, input.shape[0])

    def _routes(self, input, used_token):
        x = input.float()
        if self.noisy_gate_policy == "Jitter" and self.training:
            x = multiplicative_jitter(x, device=input.device)
        logits = F.linear(x, self.wg.weight.float())
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        if self.k == 1:
            return top1_routes(logits, factor, self.min_capacity, used_token,
                               self.noisy_gate_policy if self.training else None, self.drop_tokens, self.use_rts)
        if self.k == 2:
            return top2_routes(logits, factor, self.min_capacity, self.drop_tokens, self.top2_2nd_expert_sampling)
        return topk_routes(logits, self.k, factor, self.min_capacity, self.drop_tokens)


class MOELayer(nn.Module):
    """Tokens to their experts and back: each token's input is copied into
    its experts' slots ([experts, capacity, model]; empty slots zero), the
    experts run on their slots, and each token's output is the sum of its
    routes' outputs times their weights. `l_aux` (the gate's load-balancing
    loss) and `exp_counts` (tokens per expert) are those of the last forward."""

    def __init__(self, gate, experts, ep_group_name, ep_size, num_local_experts, use_tutel=False):
        super().__init__()
        self.gate, self.experts = gate, experts
        self.ep_group, self.ep_size, self.ep_group_name = None, ep_size, ep_group_name
        self.num_local_experts = num_local_experts
        self.use_tutel = False  # Tutel's kernels are not used here (nor, uninstalled, by DeepSpeed)
        self.wall_clock_breakdown = False
        self.time_falltoall = self.time_salltoall = self.time_moe = 0.0

    def _set_ep_group(self, ep_group):
        self.ep_group = ep_group
        self.gate._set_ep_group(ep_group)

    def forward(self, *input, **kwargs):
        d_model = input[0].shape[-1]
        tokens = input[0].reshape(-1, d_model)
        routes = self.gate(tokens, input[1] if len(input) > 1 else None, True)
        self.l_aux, self.exp_counts = routes.l_aux, routes.exp_counts
        num_experts, capacity = routes.num_experts, int(routes.capacity)
        # Each route's place in the [experts * capacity] buffer; a dropped
        # route's is one scratch place past the end.
        places = torch.where(routes.experts >= 0, routes.experts.long() * capacity + routes.slots.long(),
                             torch.full_like(routes.experts, num_experts * capacity, dtype=torch.long))
        dispatched = _to_slots(tokens, places, num_experts, capacity).contiguous()
        out = self.experts(dispatched.reshape(self.ep_size, self.num_local_experts, -1, d_model))
        out = out.reshape(self.ep_size * self.num_local_experts, -1, d_model).contiguous()
        combined = _from_slots(out.view(num_experts * capacity, d_model), places, routes.weights, tokens.shape[0])
        return combined.reshape(input[0].shape)


def _dense(routes, num_tokens):
    """Routes as DeepSpeed's dense gate output: combine_weights[s, e, c] the
    weight of token s's route to slot c of expert e (0 elsewhere), the
    dispatch mask where it is non-zero."""
    capacity = int(routes.capacity)
    combine = torch.zeros(num_tokens, routes.num_experts, capacity, dtype=routes.weights.dtype,
                          device=routes.weights.device)
    tokens = torch.arange(num_tokens, device=routes.weights.device)
    for experts, slots, weights in zip(routes.experts, routes.slots, routes.weights):
        kept = experts >= 0
        combine[tokens[kept], experts[kept].long(), slots[kept].long()] += weights[kept]
    return routes.l_aux, combine, combine.bool(), routes.exp_counts


def _to_slots(tokens, places, num_experts, capacity):
    """[experts, capacity, model]: each place holds its token's input (a
    gather from the places' inverse, the last row of zeros for empty ones)."""
    num_tokens, d_model = tokens.shape
    source = torch.full((num_experts * capacity + 1,), num_tokens, dtype=torch.long, device=places.device)
    source.scatter_(0, places.reshape(-1), torch.arange(num_tokens, device=places.device).expand_as(places).reshape(-1))
    padded = torch.cat([tokens, tokens.new_zeros(1, d_model)])
    return padded.index_select(0, source[:-1]).view(num_experts, capacity, d_model)


def _from_slots(outputs, places, weights, num_tokens):
    """Each token's routes' outputs times their weights, summed."""
    d_model = outputs.size(-1)
    padded = torch.cat([outputs, outputs.new_zeros(1, d_model)])
    routed = padded.index_select(0, places.reshape(-1)).view(places.size(0), num_tokens, d_model)
    return (routed * weights.unsqueeze(-1)).sum(0).to(outputs.dtype)
