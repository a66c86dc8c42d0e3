"""Torch's recurrent modules, counted as DeepSpeed counts them: by a closed
form over their weights, with no MACs. Their kernels (oneDNN's and cuDNN's
fused RNNs) are opaque to the aten-level counter, and the closed form holds
on every backend."""
import torch.nn as nn
from torch.nn.utils.rnn import PackedSequence

# Elementwise flops of the gates per hidden unit, as DeepSpeed estimates them.
_GATE_FLOPS = {nn.RNN: 1, nn.RNNCell: 1, nn.GRU: 7, nn.GRUCell: 7, nn.LSTM: 10, nn.LSTMCell: 10}

RECURRENT_MODULES = tuple(_GATE_FLOPS)


def recurrent_flops(module, inputs):
    """Per sample and step, each layer's two matrix-vector products at 2k - 1
    flops an output, its gates' elementwise work and its biases; times 2
    when bidirectional (DeepSpeed prices the reverse direction as the
    forward one)."""
    x = inputs[0].data if isinstance(inputs[0], PackedSequence) else inputs[0]
    layers = [""] if isinstance(module, nn.RNNCellBase) else [f"_l{i}" for i in range(module.num_layers)]
    per_step = 0
    for layer in layers:
        for weight in (getattr(module, "weight_ih" + layer), getattr(module, "weight_hh" + layer)):
            per_step += (2 * weight.shape[1] - 1) * weight.shape[0] + (weight.shape[0] if module.bias else 0)
        per_step += _GATE_FLOPS[type(module)] * module.hidden_size
    steps = x.numel() // x.shape[-1]
    return per_step * steps * (2 if getattr(module, "bidirectional", False) else 1)
