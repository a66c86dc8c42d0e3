"""DeepSpeed's LR schedules built in code (`deepspeed.runtime.lr_schedules.WarmupLR(optimizer, ...)`),
with DeepSpeed's arguments and timing: each computes the C++ library's
formulas (src/optim/lr_schedule.h) per param group and writes them into the
optimizer's param groups at construction and at every step(); give one to
initialize(lr_scheduler=...) and the engine steps it after each optimizer
step that was not skipped. OneCycle's momentum cycle needs the optimizer's
betas to move inside the fused update: it is supported from the config's
"scheduler" block, not in code (an error says so)."""
from ..optimizer import ConfigScheduler


class _FromArguments(ConfigScheduler):
    TYPE = None

    def __init__(self, optimizer, last_batch_iteration=-1, **params):
        lr = optimizer.param_groups[0]["lr"]
        super().__init__(optimizer, {"optimizer": {"type": "AdamW", "params": {"lr": lr}},
                                     "scheduler": {"type": self.TYPE,
                                                   "params": dict(params, last_batch_iteration=last_batch_iteration)}})


class WarmupLR(_FromArguments):
    TYPE = "WarmupLR"

    def __init__(self, optimizer, warmup_min_lr=0.0, warmup_max_lr=None, warmup_num_steps=1000,
                 warmup_type="log", last_batch_iteration=-1):
        params = {"warmup_min_lr": warmup_min_lr, "warmup_num_steps": warmup_num_steps, "warmup_type": warmup_type}
        if warmup_max_lr is not None:
            params["warmup_max_lr"] = warmup_max_lr
        super().__init__(optimizer, last_batch_iteration, **params)


class WarmupDecayLR(_FromArguments):
    TYPE = "WarmupDecayLR"

    def __init__(self, optimizer, total_num_steps, warmup_min_lr=0.0, warmup_max_lr=0.001, warmup_num_steps=1000,
                 warmup_type="log", last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration, total_num_steps=total_num_steps, warmup_min_lr=warmup_min_lr,
                         warmup_max_lr=warmup_max_lr, warmup_num_steps=warmup_num_steps, warmup_type=warmup_type)


class WarmupCosineLR(_FromArguments):
    TYPE = "WarmupCosineLR"

    def __init__(self, optimizer, total_num_steps, warmup_min_ratio=0.0, warmup_num_steps=1000, cos_min_ratio=0.0001,
                 warmup_type="log", last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration, total_num_steps=total_num_steps,
                         warmup_min_ratio=warmup_min_ratio, warmup_num_steps=warmup_num_steps,
                         cos_min_ratio=cos_min_ratio, warmup_type=warmup_type)


class LRRangeTest(_FromArguments):
    TYPE = "LRRangeTest"

    def __init__(self, optimizer, lr_range_test_min_lr=1e-3, lr_range_test_step_size=2000,
                 lr_range_test_step_rate=1.0, lr_range_test_staircase=False, last_batch_iteration=-1):
        super().__init__(optimizer, last_batch_iteration, lr_range_test_min_lr=lr_range_test_min_lr,
                         lr_range_test_step_size=lr_range_test_step_size,
                         lr_range_test_step_rate=lr_range_test_step_rate,
                         lr_range_test_staircase=lr_range_test_staircase)


class OneCycle(_FromArguments):
    TYPE = "OneCycle"

    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate=0.0, cycle_first_step_size=2000,
                 cycle_second_step_size=None, cycle_first_stair_count=0, cycle_second_stair_count=None,
                 decay_step_size=0, cycle_momentum=True, cycle_min_mom=0.8, cycle_max_mom=0.9, decay_mom_rate=0.0,
                 last_batch_iteration=-1):
        if cycle_momentum:
            raise NotImplementedError("zero_cpp: OneCycle(cycle_momentum=True) built in code cannot move the fused "
                                      "update's betas; put OneCycle in the ds_config's \"scheduler\" block (which does), "
                                      "or pass cycle_momentum=False")
        params = {"cycle_min_lr": cycle_min_lr, "cycle_max_lr": cycle_max_lr, "decay_lr_rate": decay_lr_rate,
                  "cycle_first_step_size": cycle_first_step_size, "cycle_first_stair_count": cycle_first_stair_count,
                  "decay_step_size": decay_step_size, "cycle_momentum": False}
        if cycle_second_step_size is not None:
            params["cycle_second_step_size"] = cycle_second_step_size
        if cycle_second_stair_count is not None:
            params["cycle_second_stair_count"] = cycle_second_stair_count
        super().__init__(optimizer, last_batch_iteration, **params)
