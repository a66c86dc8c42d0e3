"""An optimizer that only holds its param groups and settings, for
zero_cpp.initialize to map (optimizer.optimizer_block)."""
import torch


class HyperparameterHolder(torch.optim.Optimizer):
    def step(self, closure=None):
        raise RuntimeError(f"zero_cpp: {type(self).__name__} is run by the engine; pass it to zero_cpp.initialize "
                           f"and call engine.step()")
