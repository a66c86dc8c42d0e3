"""A DeepSpeed checkpoint's state in zero-cpp's terms, written as a
zero-cpp checkpoint: the counters as the C++ engine keeps them, the loss
scaler, and the client state packed as the Python front end packs its own
(the script's client_state, the LR scheduler's state, the param groups'
settings, tied names), so engine.load_checkpoint restores all of it."""
import json

from .. import _C
from .checkpoint_writer import Param, write_checkpoint
from .layouts import KINDS
from .reader import DeepSpeedCheckpoint


def convert_deepspeed_checkpoint(ds_dir, tag, out_dir, out_tag, model=None, param_groups=None):
    """Converts ds_dir/tag (tag None: the one DeepSpeed's `latest` names), a
    checkpoint DeepSpeed 0.19.8 saved at any world size, ZeRO stage 0-3,
    fp32, bf16 or fp16, with Adam or AdamW, into the zero-cpp checkpoint
    out_dir/out_tag and points out_dir/latest at it. The engine loads that
    at any world size and stage. One process, no process group.

    model, param_groups: the model it will be loaded into and its
    optimizer's param groups (as engine.load_checkpoint passes them). A
    stage-0 checkpoint numbers its optimizer state by position in the param
    groups, which these name (without them: one group of every param, in the
    model's order); the model's non-persistent buffers, which DeepSpeed does
    not save, keep the model's values, as DeepSpeed's load leaves them.

    What cannot be converted (another optimizer, model, tensor or pipeline
    parallelism, experts, a universal checkpoint, NVMe-offloaded state)
    raises DeepSpeedCheckpointError saying what and why."""
    from ..engine import _pack_client_state  # not at import: the engine imports this package to load
    ds = DeepSpeedCheckpoint(ds_dir, tag, model, param_groups)
    applied = ds.global_steps - ds.skipped_steps  # the engine counts applied steps; DeepSpeed skipped ones too
    sched = ds.lr_scheduler if isinstance(ds.lr_scheduler, dict) else {}
    batch = _C.resolve_batch(json.dumps({k: ds.config[k] for k in _BATCH_KEYS if k in ds.config}), ds.world_size)
    engine_state = {
        "global_steps": applied,
        "skipped_steps": ds.skipped_steps,
        # Adam's count (its bias correction), which may differ: DeepSpeed's
        # fp16/bf16 wrappers at stage 0 take a step of zero grads at setup.
        "optimizer_steps": ds.optimizer_steps,
        "scheduler_iter": sched.get("last_batch_iteration", applied - 1),  # DeepSpeed's scheduler starts at -1
        "last_grad_norm": 0.0,  # not saved; a fresh engine's
        "optimizer": ds.optimizer,
        "loss_scaler": _loss_scaler(ds),
        "micro_steps": ds.global_steps * batch[2],  # the loader rebuilds it with the loading run's accumulation
        "batch": {"train_batch_size": batch[0], "micro_batch_per_gpu": batch[1],
                  "gradient_accumulation_steps": batch[2]},
    }
    client_state = json.loads(_pack_client_state(ds.client_state, {
        "lr_scheduler": ds.lr_scheduler, "param_groups": ds.param_groups, "aliases": ds.aliases}))
    fields = {
        "world_size": ds.world_size,  # every fragment in rank 0's file, as in the engine's own stage-0 saves
        "dp_size": ds.world_size,
        "stage": ds.stage,
        "dtype": {"bf16": "BFloat16", "fp16": "Half", "fp32": "Float"}[ds.precision],
        "config": json.loads(json.dumps(ds.config, default=str)),
        "engine_state": engine_state,
        "client_state": client_state,
    }
    params = [Param(name, shape, lambda kind, name=name: ds.read(name, kind)) for name, shape in ds.params]
    write_checkpoint(str(out_dir), str(out_tag), fields, list(KINDS), params, ds.replicated)


_BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _loss_scaler(ds):
    """The engine's loss-scaler state (optim/loss_scaler.h): fp16's from
    DeepSpeed's, what DeepSpeed does not save (and everything without fp16)
    as the engine starts."""
    fp16 = ds.config.get("fp16") if isinstance(ds.config.get("fp16"), dict) else {}
    saved = (ds.loss_scaler or {}) if ds.precision == "fp16" else {}
    return {"scale": float(saved.get("cur_scale", 1.0)),
            "cur_hysteresis": int(saved.get("cur_hysteresis", fp16.get("hysteresis", 2))),
            "cur_iter": int(saved.get("cur_iter", 0)),
            "last_overflow_iter": int(saved.get("last_overflow_iter", -1))}
