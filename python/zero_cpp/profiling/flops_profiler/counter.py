"""What a forward costs, in the terms of DeepSpeed's flops profiler.

MACs (multiply-accumulates) are those of the matmuls, convolutions and
attention the forward runs, counted at the aten level by torch's
FlopCounterMode, whose formulas give 2 flops per MAC. DeepSpeed also gives
flops, and no MACs, to some functionals (activations, normalizations,
softmax, pooling, interpolation, a convolution's bias, torch.add and
torch.mul, the added term of addmm/baddbmm). Those are counted where
DeepSpeed counts them, at the Python call (a TorchFunctionMode): there
`F.softmax(x)` is told apart from `x.softmax()`, and `torch.add` from `+`,
which DeepSpeed leaves out.

DeepSpeed patches the Python functions themselves, so it sees only calls
made through the patched names; the counts part where that matters:
- counted here, not by DeepSpeed: any matmul or convolution kernel however
  reached (torch.tensordot); einsum as the matmuls it runs (DeepSpeed:
  numpy's estimate, no MACs); a functional a module took a reference to
  before profiling (nn.TransformerEncoderLayer's F.relu); the attention of
  nn.MultiheadAttention and nn.TransformerEncoderLayer under no_grad in
  eval, whose fused fast path DeepSpeed cannot see (with a
  TorchFunctionMode active torch takes the unfused path, counted);
- counted by DeepSpeed, not here: `x.add(y)` and `x.mul(y)`, which torch
  reports as it reports `x + y` and `x * y`; the functionals that torch
  writes in Python over other functionals (F.lp_pool*d,
  F.local_response_norm, F.interpolate(mode="area"), F.upsample) count
  their own rule only. nn.MultiheadAttention is the exception made: its
  inner softmax and baddbmm are counted, below.
"""
import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

aten = torch.ops.aten


def _attention_flops(query, key, value, *args, out_shape=None, **kwargs):
    """The fused SDPA kernel of the CPU, which FlopCounterMode has no formula
    for: q·kᵀ and the scores' product with v, shapes [..., L, E]."""
    scores = math.prod(query[:-1]) * key[-2]
    return 2 * scores * (query[-1] + value[-1])


def _first_numel(shape, *args, out_shape=None, **kwargs):
    return math.prod(shape)


def _arg(args, kwargs, index, name, default=None):
    return args[index] if len(args) > index else kwargs.get(name, default)


def _input_numel(args, kwargs, out):
    return _arg(args, kwargs, 0, "input").numel()


def _out_numel(args, kwargs, out):
    return out.numel()


def _bias_flops(args, kwargs, out):
    """A convolution's bias: one add per output element."""
    return out.numel() if _arg(args, kwargs, 2, "bias") is not None else 0


def _normalization(weight_at, training_at=None):
    """DeepSpeed's estimate per element: 4 flops normalizing with the batch's
    statistics, 1 with running ones (batch norm in eval); 1 more for the
    affine transform."""
    def flops(args, kwargs, out):
        per_element = 4 if training_at is None or _arg(args, kwargs, training_at, "training", False) else 1
        if _arg(args, kwargs, weight_at, "weight") is not None:
            per_element += 1
        return _input_numel(args, kwargs, out) * per_element
    return flops


def _interpolate_flops(args, kwargs, out):
    """DeepSpeed's count: the requested size alone when given (batch and
    channels left out), else the input's elements times the scale factors."""
    size = _arg(args, kwargs, 1, "size")
    if size is not None:
        return math.prod(size) if isinstance(size, (tuple, list)) else int(size)
    x, scale = _arg(args, kwargs, 0, "input"), _arg(args, kwargs, 2, "scale_factor")
    factor = math.prod(scale) if isinstance(scale, (tuple, list)) else scale ** (x.dim() - 2)
    return int(x.numel() * factor)


# The functionals DeepSpeed gives flops but no MACs, with its counts.
_ZERO_MAC_FLOPS = {
    **dict.fromkeys([F.relu, F.prelu, F.elu, F.leaky_relu, F.relu6, F.silu, F.gelu, F.softmax,
                     F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.max_pool1d, F.max_pool2d, F.max_pool3d,
                     F.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d,
                     F.adaptive_max_pool1d, F.adaptive_max_pool2d, F.adaptive_max_pool3d], _input_numel),
    F.batch_norm: _normalization(weight_at=3, training_at=5),
    F.instance_norm: _normalization(weight_at=3),
    F.layer_norm: _normalization(weight_at=2),
    F.group_norm: _normalization(weight_at=2),
    F.interpolate: _interpolate_flops,
    **dict.fromkeys([F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d],
                    _bias_flops),
    # The term added to the product; F.linear's bias, at the aten level an addmm too, is not counted.
    **dict.fromkeys([torch.addmm, torch.Tensor.addmm, torch.baddbmm], _input_numel),
    # Not Tensor.add or Tensor.mul: torch calls the methods as it calls + and *.
    **dict.fromkeys([torch.add, torch.mul], _out_numel),
}


class _FunctionalFlops(TorchFunctionMode):
    """Adds up the zero-MAC flops of the functionals called while active."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.multi_head_attention_forward:
            return self._attention(func, args, kwargs)
        out = func(*args, **kwargs)
        rule = _ZERO_MAC_FLOPS.get(func)
        if rule is not None:
            self.flops += rule(args, kwargs, out)
        return out

    def _attention(self, func, args, kwargs):
        # Torch runs a function this mode handles with the mode off, so the F.softmax
        # and torch.baddbmm DeepSpeed counts inside nn.MultiheadAttention are counted
        # from their aten ops here, the only ones of their kind in that function.
        inner = FlopCounterMode(display=False, custom_mapping={aten._softmax: _first_numel,
                                                               aten.baddbmm: _first_numel})
        with inner:
            out = func(*args, **kwargs)
        counts = inner.get_flop_counts().get("Global", {})
        self.flops += counts.get(aten._softmax, 0) + counts.get(aten.baddbmm, 0)
        return out


class ForwardCounter:
    """A context that counts the work done inside it; `totals()` reads the
    running (flops, MACs) at any point, so a caller attributes a stretch of
    it by difference. Not reentrant."""

    def __init__(self):
        # Torch imports dynamo (about a second) at a dispatch mode's first op: here,
        # not inside the first profiled module's latency.
        import torch._dynamo  # noqa: F401
        self._matmuls = FlopCounterMode(display=False, custom_mapping={
            aten._scaled_dot_product_flash_attention_for_cpu: _attention_flops})
        self._functionals = _FunctionalFlops()

    def __enter__(self):
        self._functionals.flops = 0
        self._matmuls.__enter__()
        self._functionals.__enter__()
        return self

    def __exit__(self, *exc):
        self._functionals.__exit__(*exc)
        self._matmuls.__exit__(*exc)

    def totals(self):
        matmul_flops = self._matmuls.get_total_flops()
        return matmul_flops + self._functionals.flops, matmul_flops // 2
