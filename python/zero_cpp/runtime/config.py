"""DeepSpeed's `deepspeed.runtime.config.DeepSpeedConfig`: a ds_config read
as the engine reads it, for scripts that build one themselves (DeepSpeed's
Monitor tutorial: `MonitorMaster(DeepSpeedConfig(path).monitor_config)`).
The values are the C++ parser's, DeepSpeed's defaults filled in; the batch
sizes resolved for the data-parallel world as DeepSpeed resolves them."""
import json
from types import SimpleNamespace

import torch.distributed as dist

from .. import config as configs


def _namespace(block):
    return SimpleNamespace(**{k: _namespace(v) if isinstance(v, dict) else v for k, v in block.items()})


class DeepSpeedConfig:
    """The config at `config` (a path or a dict). `mpu` (model parallelism)
    is refused: zero_cpp is data parallel only."""

    def __init__(self, config, mpu=None, mesh_device=None):
        if mpu is not None or mesh_device is not None:
            raise NotImplementedError("zero_cpp: DeepSpeedConfig(mpu=..., mesh_device=...): model parallelism is "
                                      "not supported; the data-parallel world is every rank")
        given = configs.load(config=config)
        engine_config = configs.for_engine(given)
        self._param_dict = given
        resolved = json.loads(configs.parse(configs.for_cxx(engine_config)))
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        (self.train_batch_size, self.train_micro_batch_size_per_gpu,
         self.gradient_accumulation_steps) = configs.resolve_batch(engine_config, self.world_size)
        zero = resolved["zero_optimization"]
        self.zero_config = _namespace(zero)
        self.zero_optimization_stage = zero["stage"]
        self.zero_enabled = zero["stage"] > 0
        precision = configs.precision(engine_config)
        self.fp16_enabled = precision == "fp16"
        self.bfloat16_enabled = precision == "bf16"
        self.gradient_clipping = float(resolved["gradient_clipping"])
        self.steps_per_print = resolved.get("steps_per_print")
        self.wall_clock_breakdown = bool(resolved["wall_clock_breakdown"])
        optimizer = given.get("optimizer") or {}
        self.optimizer_name = optimizer.get("type", None) and optimizer["type"].lower()
        self.optimizer_params = optimizer.get("params")
        scheduler = given.get("scheduler") or {}
        self.scheduler_name = scheduler.get("type")
        self.scheduler_params = scheduler.get("params")
        self.dataloader_drop_last = bool(given.get("dataloader_drop_last", False))
        self.monitor_config = monitor_config(engine_config)
        self.flops_profiler_config = _namespace(configs.python_block(engine_config, "flops_profiler"))
        self.activation_checkpointing_config = _namespace(
            configs.python_block(engine_config, "activation_checkpointing"))


def monitor_config(config):
    """DeepSpeed's monitor_config: `enabled` when any backend is, and each
    backend's block (tensorboard, wandb, csv_monitor, comet)."""
    blocks = {name: _namespace(configs.python_block(config, name))
              for name in ("tensorboard", "wandb", "csv_monitor", "comet")}
    return SimpleNamespace(enabled=any(bool(b.enabled) for b in blocks.values()), **blocks)
