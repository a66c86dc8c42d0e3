"""DeepSpeed's tools around the engine, on 2 ranks (zero-run -n 2 -- python
tools_test.py TMPDIR, one directory both
ranks see): the monitor (TensorBoard read back through
tensorboard's own reader, CSV files), DeepSpeedConfig, the activation
checkpointing settings, the engine's timers, dtypes and flops profile. Every
check prints "ok" or "FAIL" (rank 0); the exit status is the number of
failures."""
import glob
import json
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import zero_cpp as deepspeed
from zero_cpp.monitor.monitor import MonitorMaster
from zero_cpp.runtime.config import DeepSpeedConfig

from checks import check, finish, raises

TMP = sys.argv[1]


class Mlp(nn.Module):
    def __init__(self, width=32):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.hidden = nn.Linear(width, width)
        self.out = nn.Linear(width, 1)

    def forward(self, x, y):
        h = torch.tanh(self.inp(x.to(self.inp.weight.dtype)))
        h = torch.tanh(self.hidden(h))
        return F.mse_loss(self.out(h).float(), y)


def config(stage=1, **extra):
    return dict({"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
                 "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
                 "zero_optimization": {"stage": stage}}, **extra)


def batch(step, rank):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(8, 8, generator=g)
    y = x.sum(1, keepdim=True).sin()
    return x[4 * rank:4 * rank + 4], y[4 * rank:4 * rank + 4]


def make(cfg, seed=0):
    torch.manual_seed(seed)
    engine, _, _, _ = deepspeed.initialize(model=Mlp(), model_parameters=None, config=cfg)
    return engine


def test_monitor_tensorboard():
    """The engine's events and a script's own, read back from the event
    file by tensorboard's reader; only rank 0 writes one."""
    out = os.path.join(TMP, "tb")
    engine = make(config(tensorboard={"enabled": True, "output_path": out, "job_name": "run"},
                         wall_clock_breakdown=True,
                         scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2,
                                                                   "warmup_num_steps": 4}}))
    lrs, losses = [], []
    for step in range(3):
        loss = engine(*batch(step, engine.global_rank))
        engine.backward(loss)
        engine.step()
        lrs.append((engine.global_samples, engine.get_lr()[0]))
        losses.append((engine.global_samples, loss.item()))
        engine.monitor.write_events([("Train/loss", loss, engine.global_samples)])
    dist.barrier()
    files = glob.glob(os.path.join(out, "run", "events.out.tfevents.*"))
    check(len(files) == 1, f"tensorboard: one event file, rank 0's ({len(files)})")
    if engine.global_rank != 0 or len(files) != 1:
        return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(files[0])
    acc.Reload()
    tags = set(acc.Tags()["scalars"])

    def series(tag):
        return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in tags else []

    def close(a, b):
        return len(a) == len(b) and all(s == t and abs(u - v) <= 1e-6 * max(1.0, abs(v))
                                        for (s, u), (t, v) in zip(a, b))

    check(close(series("Train/Samples/lr"), lrs), f"tensorboard: Train/Samples/lr at each step's global_samples "
          f"is engine.get_lr() ({series('Train/Samples/lr')} vs {lrs})")
    check(close(series("Train/loss"), losses), "tensorboard: the script's own events (engine.monitor.write_events)")
    phases = {t for t in tags if t.startswith("Train/Samples/elapsed_time_ms_")}
    check({"Train/Samples/elapsed_time_ms_forward", "Train/Samples/elapsed_time_ms_backward",
           "Train/Samples/elapsed_time_ms_step"} <= phases and
          all(v >= 0 and s in (8, 16, 24) for t in phases for s, v in series(t)),
          f"tensorboard: wall_clock_breakdown's phases per step ({sorted(phases)})")
    check("Train/Samples/loss_scale" not in tags, "tensorboard: no loss scale without fp16")


def test_monitor_csv():
    """The ds_config's csv_monitor: DeepSpeed's events in DeepSpeed's layout
    (the lr the next step takes, after the scheduler stepped; no train_loss,
    which DeepSpeed does not write; its phase names), and a script's
    MonitorMaster from DeepSpeedConfig (the Monitor tutorial) beside them."""
    out = os.path.join(TMP, "csv")
    cfg = config(csv_monitor={"enabled": True, "output_path": out, "job_name": "job"}, wall_clock_breakdown=True,
                 scheduler={"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 1e-2,
                                                           "warmup_num_steps": 4}})
    path = os.path.join(TMP, f"ds_config_{dist.get_rank()}.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    monitor = MonitorMaster(DeepSpeedConfig(path).monitor_config)
    check(monitor.enabled and monitor.tb_monitor is None, "monitor: MonitorMaster enabled, CSV alone")
    engine = make(cfg)
    lrs = []
    for step in range(2):
        loss = engine(*batch(step, engine.global_rank))
        engine.backward(loss)
        engine.step()
        lrs.append(f"{engine.global_samples},{engine.get_lr()[0]!r}")
        monitor.write_events([("Time per step", 0.5 + step, engine.global_samples),
                              ("Train/loss", loss.detach(), engine.global_samples)])
    dist.barrier()
    if engine.global_rank != 0:
        return
    job = os.path.join(out, "job")
    with open(os.path.join(job, "Time_per_step.csv")) as f:
        text = f.read()
    check(text == "step,Time per step\n8,0.5\n16,1.5\n", f"csv: a script's event, DeepSpeed's layout ({text!r})")
    with open(os.path.join(job, "Train_loss.csv")) as f:
        rows = f.read().splitlines()
    check(rows[0] == "step,loss" and all(not r.split(",")[1].startswith("tensor") for r in rows[1:]),
          f"csv: a tensor's value written as its number ({rows})")
    with open(os.path.join(job, "Train_Samples_lr.csv")) as f:
        engine_rows = f.read().splitlines()
    check(engine_rows == ["step,lr"] + lrs, f"csv: the engine's lr at each step is the one the next step takes, "
          f"as DeepSpeed writes it ({engine_rows} vs {lrs})")
    files = sorted(os.listdir(job))
    phases = ["forward", "backward", "backward_inner", "backward_allreduce", "step"]
    check(files == sorted(["Time_per_step.csv", "Train_loss.csv", "Train_Samples_lr.csv"] +
                          [f"Train_Samples_elapsed_time_ms_{p}.csv" for p in phases]),
          f"csv: DeepSpeed's events and phase names, no others ({files})")


def test_deepspeed_config():
    """DeepSpeedConfig reads a config as the engine does: the batch sizes
    for this world, the stage, the precision."""
    cfg = config(stage=2, train_batch_size=16, bf16={"enabled": True})
    ds = DeepSpeedConfig(cfg)
    engine = make(cfg)
    check((ds.train_batch_size, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) ==
          (engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
           engine.gradient_accumulation_steps()) == (16, 4, 2),
          "DeepSpeedConfig: the batch triad resolved for 2 ranks, as the engine's")
    check(ds.zero_optimization_stage == 2 and ds.zero_enabled and ds.bfloat16_enabled and not ds.fp16_enabled
          and ds.gradient_clipping == engine.gradient_clipping() and not ds.monitor_config.enabled,
          "DeepSpeedConfig: stage, precision, clipping, monitor off")
    check(engine.get_data_types() == (torch.bfloat16, torch.bfloat16), "engine.get_data_types() in bf16")
    fp32 = make(config(data_types={"grad_accum_dtype": "fp32"}))
    check(fp32.get_data_types() == (torch.float32, torch.float32), "engine.get_data_types() with grad_accum_dtype")


def test_throughput_timer():
    """engine.tput_timer counts the micro steps and optimizer steps the
    engine ran (2 micro steps each) and, past its warm-up, a rate no larger
    than the samples over the wall time measured around the steps it timed."""
    import time
    engine = make(config(train_batch_size=16))
    timer = engine.tput_timer
    timed_from = None
    for step in range(6):
        if step == timer.start_step:
            timed_from = time.perf_counter()
        for micro in range(2):
            loss = engine(*batch(2 * step + micro, engine.global_rank))
            engine.backward(loss)
            engine.step()
    wall = time.perf_counter() - timed_from
    check((timer.global_step_count, timer.micro_step_count, timer.batch_size) == (6, 12, 16),
          f"tput_timer: 6 steps of 2 micro steps, batch 16 ({timer.global_step_count}, {timer.micro_step_count}, "
          f"{timer.batch_size})")
    rate = timer.avg_samples_per_sec()
    check(16 * (6 - timer.start_step) / wall <= rate < float("inf"),
          f"tput_timer: {rate:.0f} samples/s, at least the {16 * (6 - timer.start_step) / wall:.0f} of the wall time")


def test_comms_logger():
    """The ds_config's comms_logger: every collective the engine runs while
    it is on, by op, as many and as large as the engine's own counters say;
    a script's calls through deepspeed.comm; prof_ops; log_summary's dict."""
    import time
    names = {"allgather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor",
             "all_reduce": "all_reduce", "broadcast": "broadcast", "barrier": "barrier"}
    engine = make(config(stage=2, comms_logger={"enabled": True, "prof_all": True}))
    logger = deepspeed.comm.comms_logger
    before = engine.comm_counts()
    logger.reset_data()
    start = time.perf_counter()
    for step in range(3):
        loss = engine(*batch(step, engine.global_rank))
        engine.backward(loss)
        engine.step()
    wall_ms = (time.perf_counter() - start) * 1e3
    after = engine.comm_counts()
    logged = logger.get_raw_data()
    expected = {names[op]: (c["calls"] - before.get(op, {}).get("calls", 0),
                            c["bytes"] - before.get(op, {}).get("bytes", 0)) for op, c in after.items()}
    expected = {op: v for op, v in expected.items() if v[0] > 0}
    got = {op: (sum(v[0] for v in sizes.values()),
                # A gather's message is one rank's shard (DeepSpeed's sizes); the counters count the whole.
                sum(v[0] * size * (engine.world_size if op == "all_gather_into_tensor" else 1)
                    for size, v in sizes.items())) for op, sizes in logged.items()}
    check(got == expected and "reduce_scatter_tensor" in got,
          f"comms logger: the engine's collectives, calls and bytes as its counters ({got} vs {expected})")
    latencies = [ms for sizes in logged.values() for v in sizes.values() for ms in v[1]]
    check(all(ms > 0 for ms in latencies) and sum(latencies) <= wall_ms,
          f"comms logger: each latency positive, all within the loop's {wall_ms:.1f} ms ({sum(latencies):.2f})")
    t = torch.ones(1000)
    deepspeed.comm.all_reduce(t)
    check(logger.get_raw_data()["all_reduce"][4000][0] >= 1 and t[0].item() == 2.0,
          "comms logger: a script's deepspeed.comm.all_reduce, logged at its 4000 bytes")
    deepspeed.comm.configure(prof_all=False, prof_ops=["all_reduce"])

    def calls():
        return {op: sum(v[0] for v in sizes.values()) for op, sizes in logger.get_raw_data().items()}

    was = calls()
    loss = engine(*batch(3, engine.global_rank))
    engine.backward(loss)
    engine.step()
    now = calls()
    check(now["reduce_scatter_tensor"] == was["reduce_scatter_tensor"] and now["all_reduce"] > was["all_reduce"],
          f"comms logger: prof_ops=['all_reduce'] logs only the engine's all-reduces ({was} -> {now})")
    summary = deepspeed.comm.log_summary(show_straggler=True, return_dict=True)
    rs = summary["summary"]["reduce_scatter_tensor"]
    check(all(s["count"] == 3 and s["total_latency_ms"] > 0 and s["busbw_avg_gbps"] > 0 for s in rs.values()) and
          all(e["total_straggler_ms"] >= 0 for e in summary["straggler_analysis"]["reduce_scatter_tensor"].values()),
          f"comms logger: log_summary's dict, DeepSpeed's fields, straggler analysis ({rs})")
    deepspeed.comm.configure(enabled=False)


def test_config_scheduler():
    """The config's scheduler is an instance of DeepSpeed's class of that
    name, and OneCycle's momentum cycle shows in the param groups
    (engine.get_mom()) as DeepSpeed's OneCycle writes it, lr and betas
    step by step against DeepSpeed's own on a torch optimizer."""
    from deepspeed.runtime import lr_schedules as theirs
    from zero_cpp.runtime import lr_schedules as ours
    params = {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-2, "cycle_first_step_size": 2, "cycle_momentum": True,
              "cycle_min_mom": 0.85, "cycle_max_mom": 0.95}
    engine = make(config(scheduler={"type": "OneCycle", "params": params}))
    check(isinstance(engine.lr_scheduler, ours.OneCycle), f"the config's OneCycle is a OneCycle "
          f"({type(engine.lr_scheduler).__name__})")
    reference = torch.optim.AdamW([nn.Parameter(torch.zeros(1))], lr=1e-2)
    oracle = theirs.OneCycle(reference, **params)
    seen, want = [], []
    for step in range(5):
        loss = engine(*batch(step, engine.global_rank))
        engine.backward(loss)
        engine.step()
        oracle.step()
        seen.append((engine.get_lr()[0], tuple(engine.get_mom()[0])))
        want.append((reference.param_groups[0]["lr"], tuple(reference.param_groups[0]["betas"])))
    check(all(abs(a - b) <= 1e-12 and all(abs(x - y) <= 1e-12 for x, y in zip(m, n))
              for (a, m), (b, n) in zip(seen, want)),
          f"OneCycle: lr and betas at each step are DeepSpeed's ({seen} vs {want})")


def test_config_errors():
    for cfg, text in ((config(tensorboard={"enabled": True, "output": "x"}), "tensorboard.output"),
                      # The trackers' clients are not installed here: named on every rank.
                      (config(wandb={"enabled": True}), "pip install wandb"),
                      (config(comet={"enabled": True}), 'pip install "comet_ml>=3.41.0"'),
                      (config(wandb={"enabled": True, "entity": "me"}), "wandb.entity"),
                      (config(activation_checkpointing={"profile": True}), "activation_checkpointing.profile"),
                      (config(activation_checkpointing={"contiguous_memory_optimization": True}),
                       "partition_activations"),
                      (config(torch_autocast={"enabled": True, "dtype": "float16"}), "GradScaler"),
                      (config(torch_autocast={"enabled": True, "dtype": "bf17"}), "bf17"),
                      (config(torch_autocast={"enabled": True, "lower_precision_safe_modules": ["torch.nn.Nope"]}),
                       "torch.nn.Nope")):
        ok, msg = raises(lambda: make(cfg), Exception, text)
        check(ok, f"config error names {text} ({msg[:120]})")
    # Where DeepSpeed's check is an assert (or a ValueError), a script's
    # `except AssertionError` (ValueError) catches ours too.
    for cfg, kind, text in (({"train_batch_size": 7, "train_micro_batch_size_per_gpu": 2,
                              "gradient_accumulation_steps": 2}, AssertionError, "train_batch_size (7)"),
                            ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 3}, AssertionError, "8"),
                            (None, AssertionError, "no ds_config"),
                            (os.path.join(TMP, "no-such.json"), ValueError, "no-such.json")):
        ok, msg = raises(lambda: deepspeed.initialize(model=Mlp(), config=cfg and (
            dict(cfg, optimizer={"type": "SGD", "params": {"lr": 0.1}}) if isinstance(cfg, dict) else cfg)),
                         kind, text)
        ok2, _ = raises(lambda: deepspeed.initialize(model=Mlp(), config=cfg), deepspeed.DeepSpeedConfigError, "")
        check(ok and ok2, f"a {kind.__name__} as DeepSpeed's, and a DeepSpeedConfigError, naming {text!r} ({msg[:120]})")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.2)

    def forward(self, x, scale=1.0):
        return self.b(self.drop(torch.relu(self.a(x)))) * scale


def test_activation_checkpointing():
    """deepspeed.checkpointing with DeepSpeed's settings: the same grads as
    no checkpointing, bit for bit (dropout replayed), through the engine's
    stage 3 too."""
    torch.manual_seed(1)
    block = Block()
    x = torch.randn(4, 16, requires_grad=True)

    def grads(use_checkpoint):
        block.zero_grad()
        x.grad = None
        torch.manual_seed(5)
        out = deepspeed.checkpointing.checkpoint(block, x, scale=2.0) if use_checkpoint else block(x, scale=2.0)
        out.square().sum().backward()
        return [p.grad.clone() for p in block.parameters()] + [x.grad.clone()]

    plain = grads(False)
    check(not deepspeed.checkpointing.is_configured(), "checkpointing: not configured before configure()")
    path = os.path.join(TMP, f"ac_{dist.get_rank()}.json")
    with open(path, "w") as f:
        json.dump(config(activation_checkpointing={
            "partition_activations": True, "contiguous_memory_optimization": True, "number_checkpoints": 4,
            "cpu_checkpointing": True, "synchronize_checkpoint_boundary": True}), f)
    deepspeed.checkpointing.configure(None, deepspeed_config=path)
    check(deepspeed.checkpointing.is_configured(), "checkpointing: configured from the ds_config's block")
    recomputed = grads(True)
    check(all(torch.equal(a, b) for a, b in zip(plain, recomputed)),
          "checkpointing: grads equal to no checkpointing, keyword arguments and dropout included")
    # DeepSpeed's is reentrant: a layer fed by no input that needs grad gets no grads (its loss differs
    # from a plain forward's); torch's non-reentrant one gives them.
    frozen_input = torch.randn(4, 16)
    check(not deepspeed.checkpointing.checkpoint(block, frozen_input).requires_grad and
          deepspeed.checkpointing.non_reentrant_checkpoint(block, frozen_input).requires_grad,
          "checkpointing: reentrant as DeepSpeed's (no grads through an input that needs none); "
          "non_reentrant_checkpoint not")
    ok, msg = raises(lambda: deepspeed.checkpointing.configure(None, profile=True), Exception, "profile")
    check(ok, f"checkpointing: profile refused by name ({msg[:80]})")
    deepspeed.checkpointing.configure(None, deepspeed_config=path)

    class Net(nn.Module):
        def __init__(self, use_checkpoint):
            super().__init__()
            self.use_checkpoint = use_checkpoint
            self.inp = nn.Linear(16, 16)  # the checkpointed blocks' input needs grad, as an embedding's does
            self.blocks = nn.ModuleList([Block() for _ in range(2)])
            self.head = nn.Linear(16, 1)

        def forward(self, x, y):
            x = self.inp(x)
            for blk in self.blocks:
                x = deepspeed.checkpointing.checkpoint(blk, x) if self.use_checkpoint else blk(x)
            return F.mse_loss(self.head(x), y)

    losses = {}
    for use in (False, True):
        torch.manual_seed(3)
        engine, _, _, _ = deepspeed.initialize(model=Net(use), config=config(
            stage=3, zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0},
            activation_checkpointing={"partition_activations": True, "cpu_checkpointing": True}))
        seen = []
        for step in range(3):
            g = torch.Generator().manual_seed(step)
            xs, ys = torch.randn(8, 16, generator=g), torch.randn(8, 1, generator=g)
            r = engine.global_rank
            torch.manual_seed(100 + step)
            loss = engine(xs[4 * r:4 * r + 4], ys[4 * r:4 * r + 4])
            engine.backward(loss)
            engine.step()
            seen.append(loss.item())
        losses[use] = seen
    check(losses[True] == losses[False], f"checkpointing at stage 3: the same losses ({losses})")


def test_flops_profiler_in_the_engine():
    """The ds_config's flops_profiler: rank 0 profiles the forward of step
    profile_step and writes it to output_file, with the flops the
    standalone profiler counts on the same model and batch; nothing else
    writes. At stage 3 too (params released between units)."""
    from zero_cpp.profiling.flops_profiler import get_model_profile, number_to_string, params_to_string
    x, y = batch(0, 0)
    expected_flops, _, expected_params = get_model_profile(Mlp(), args=[x, y], print_profile=False,
                                                           as_string=False)
    for stage in (1, 3):
        out = os.path.join(TMP, f"flops_{stage}.txt")
        engine = make(config(stage=stage, flops_profiler={"enabled": True, "profile_step": 2, "module_depth": -1,
                                                          "top_modules": 1, "detailed": True,
                                                          "output_file": out}, wall_clock_breakdown=stage == 3))
        for step in range(4):
            loss = engine(*batch(step, engine.global_rank))
            engine.backward(loss)
            engine.step()
            if step == 1:
                check(not os.path.exists(out), f"stage {stage} flops profiler: nothing written before its step")
        dist.barrier()
        if engine.global_rank != 0:
            continue
        with open(out) as f:
            text = f.read()
        flops_line = [ln for ln in text.splitlines() if ln.startswith("fwd flops per GPU:")]
        check(len(flops_line) == 1 and flops_line[0].endswith(" " + number_to_string(expected_flops)) and
              text.count("Profile at step 3") == 1,
              f"stage {stage} flops profiler: step 2's forward, once, with the standalone count "
              f"{number_to_string(expected_flops)} ({flops_line})")
        params_line = [ln for ln in text.splitlines() if ln.startswith("params per GPU:")]
        check(len(params_line) == 1 and params_line[0].endswith(" " + params_to_string(expected_params)),
              f"stage {stage} flops profiler: the model's {expected_params} params, full size")
        latencies = [ln.split(":")[0] for ln in text.splitlines()
                     if ln.split(":")[0] in ("fwd latency", "bwd latency", "step latency", "iter latency")]
        check(latencies == (["fwd latency", "bwd latency", "step latency", "iter latency"] if stage == 3
                            else ["fwd latency"]),
              f"stage {stage} flops profiler: the backward and step latencies with wall_clock_breakdown, as "
              f"DeepSpeed's ({latencies})")


def test_memory_breakdown():
    """The ds_config's memory_breakdown: rank 0 logs the memory in use before
    and after each forward, backward and step, under DeepSpeed's messages;
    without it, nothing."""
    import logging

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__()
            self.said = []

        def emit(self, record):
            self.said.append(record.getMessage().split(" |")[0])

    lines = Lines()
    deepspeed.utils.logger.addHandler(lines)
    try:
        for on in (True, False):
            engine = make(config(stage=2, memory_breakdown=on))
            del lines.said[:]
            engine.backward(engine(*batch(0, engine.global_rank)))
            engine.step()
            said = [m for m in lines.said if m.startswith("Engine ")]
            want = [f"Engine {w} {p}" for p in ("forward", "backward", "step") for w in ("before", "after")]
            check(said == (want if on and dist.get_rank() == 0 else []) and engine.memory_breakdown() == on,
                  f"memory_breakdown {on}: {said} on rank {dist.get_rank()}")
    finally:
        deepspeed.utils.logger.removeHandler(lines)


def test_engine_timers():
    """DeepSpeed's engine.timers and get_wall_clock_timers(): with
    wall_clock_breakdown, each phase timed under DeepSpeed's names, per
    micro-step and per step; a script's own timer beside them; the flops
    profile then prints the backward and step latencies."""
    cfg = config(stage=2, wall_clock_breakdown=True, gradient_accumulation_steps=2)
    engine = make(cfg)
    check(engine.get_wall_clock_timers() == {}, "get_wall_clock_timers() is empty before a step, as DeepSpeed's")
    engine.timers("script").start()
    for step in range(4):
        loss = engine(*batch(step, engine.global_rank))
        engine.backward(loss)
        engine.step()
        if step == 2:  # a micro-step that is not a boundary
            micro = dict(engine.get_wall_clock_timers())
    engine.timers("script").stop()
    t = engine.get_wall_clock_timers()
    names = ("fwd", "bwd", "bwd_inner", "bwd_allreduce", "step")
    check(all(n in t for n in names + tuple(f"{n}_microstep" for n in names)) and
          all(t[n] > 0 for n in ("fwd", "bwd", "bwd_inner", "step", "fwd_microstep", "bwd_microstep")) and
          t["bwd_allreduce"] >= 0 and t["bwd_inner"] + t["bwd_allreduce"] <= t["bwd"] * 1.01 + 0.05,
          f"each phase timed under DeepSpeed's names, the backward split into its inner part and reduction "
          f"({ {k: round(v, 3) for k, v in t.items()} })")
    check(micro["fwd"] >= micro["fwd_microstep"] > 0 and micro.get("step", 0) >= 0,
          f"between boundaries the step timers accumulate the micro-steps' (fwd {micro['fwd']:.3f} >= "
          f"fwd_microstep {micro['fwd_microstep']:.3f} ms)")
    check(engine.timers("script").elapsed() > sum(t[n] for n in ("fwd_microstep", "bwd_microstep")),
          "a script's own timer beside the engine's")
    plain = make(config(stage=2))
    plain.backward(plain(*batch(0, plain.global_rank)))
    plain.step()
    check(plain.get_wall_clock_timers() == {} and not plain.timers.get_timers().get("fwd"),
          "without wall_clock_breakdown the engine times nothing")


def test_engine_and_comm_odds():
    """DeepSpeed's smaller names scripts and Hugging Face's Trainer call:
    get_global_grad_norm()'s type, empty_partition_cache(), compile() and
    is_compiled, deepspeed.comm's launcher and capability queries."""
    for stage in (0, 2, 3):
        engine = make(config(stage=stage, gradient_clipping=1.0))
        engine.backward(engine(*batch(0, engine.global_rank)))
        engine.step()
        norm = engine.get_global_grad_norm()
        check(isinstance(norm, float) if stage == 0 else (torch.is_tensor(norm) and norm.dim() == 0),
              f"stage {stage}: get_global_grad_norm() is DeepSpeed's type ({type(norm).__name__}: "
              f"{float(norm):.4f}), .item() working where DeepSpeed's does")
        engine.empty_partition_cache()
        before = engine.is_compiled
        engine.compile(backend="eager")
        loss = engine(*batch(1, engine.global_rank))
        engine.backward(loss)
        engine.step()
        check(not before and engine.is_compiled and torch.isfinite(loss),
              f"stage {stage}: empty_partition_cache(), compile(backend) and is_compiled, and training goes on")
    comm = deepspeed.comm
    check(comm.get_world_rank_from_launcher() == dist.get_rank() and
          comm.get_world_size_from_launcher() == dist.get_world_size() and
          comm.has_all_gather_into_tensor() and comm.has_reduce_scatter_tensor(),
          "deepspeed.comm's launcher and capability queries")
    t = torch.full((2,), float(dist.get_rank() + 1))
    check(torch.equal(comm.inference_all_reduce(t), torch.full((2,), 3.0)),
          "deepspeed.comm.inference_all_reduce sums in place over the ranks")


# Python's own finders, minus DeepSpeed: a process in which DeepSpeed is not installed.
_WITHOUT_DEEPSPEED = """
import importlib.machinery, sys
class WithoutDeepSpeed(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name == "deepspeed" or name.startswith("deepspeed."):
            return None
        return super().find_spec(name, path, target)
sys.meta_path[sys.meta_path.index(importlib.machinery.PathFinder)] = WithoutDeepSpeed
"""

_SUBMODULE_IMPORTS = """
import sys
import zero_cpp as deepspeed
from deepspeed.utils import safe_get_full_fp32_param
from deepspeed.ops.adam import FusedAdam
from deepspeed.accelerator import get_accelerator
import deepspeed.runtime.zero.partition_parameters as pp
from deepspeed.runtime.engine import DeepSpeedEngine
from deepspeed.runtime.activation_checkpointing.checkpointing import checkpoint
from deepspeed.monitor.wandb import WandbMonitor
from deepspeed.monitor.comet import CometMonitor
import zero_cpp
assert WandbMonitor is zero_cpp.monitor.wandb.WandbMonitor and CometMonitor is zero_cpp.monitor.comet.CometMonitor
assert deepspeed.DeepSpeedConfig is zero_cpp.runtime.config.DeepSpeedConfig
assert DeepSpeedEngine is zero_cpp.DeepSpeedEngine and checkpoint is zero_cpp.checkpointing.checkpoint
assert safe_get_full_fp32_param is zero_cpp.utils.safe_get_full_fp32_param
assert FusedAdam is zero_cpp.ops.adam.FusedAdam and get_accelerator is zero_cpp.get_accelerator
assert pp is zero_cpp.runtime.zero.partition_parameters and sys.modules["deepspeed"] is zero_cpp
assert zero_cpp.utils.__spec__.name == "zero_cpp.utils"
from deepspeed.moe.layer import MoE
from deepspeed.inference.engine import InferenceEngine
from deepspeed.runtime.zero.tiling import TiledLinear
from deepspeed.monitor.monitor import csvMonitor, TensorBoardMonitor
assert csvMonitor is zero_cpp.monitor.csv_monitor.csvMonitor
assert TensorBoardMonitor is zero_cpp.monitor.tensorboard.TensorBoardMonitor
assert MoE is zero_cpp.moe.layer.MoE and InferenceEngine is zero_cpp.InferenceEngine
assert TiledLinear is zero_cpp.zero.TiledLinear
try:
    import deepspeed.pipe
except ModuleNotFoundError as e:
    print("absent:", e)
print("ALIASED")
"""


def test_deepspeed_submodule_imports():
    # A script changed to `import zero_cpp as deepspeed` that also imports
    # from DeepSpeed's submodules: zero_cpp's where DeepSpeed is not
    # installed; DeepSpeed's own, untouched, where it is.
    if dist.get_rank() != 0:
        return
    # A process of its own, outside this job's launch (its rank variables left out).
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "HOME", "OMP_NUM_THREADS", "TMPDIR")}
    run = lambda code: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                                      env=env)
    absent = run(_WITHOUT_DEEPSPEED + _SUBMODULE_IMPORTS)
    check(absent.returncode == 0 and "ALIASED" in absent.stdout and "No module named 'deepspeed.pipe'" in absent.stdout,
          "without DeepSpeed installed, `from deepspeed.X import Y` after `import zero_cpp as deepspeed` finds "
          f"zero_cpp's modules themselves; a module zero_cpp lacks is not found ({(absent.stderr or absent.stdout)[-300:]})")
    present = run("import warnings, torch, zero_cpp, deepspeed\n"
                  "with warnings.catch_warnings(record=True) as w:\n"
                  "    warnings.simplefilter('always')\n"
                  "    zero_cpp.initialize(model=torch.nn.Linear(2, 2), config={'train_batch_size': 1, 'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}}})\n"
                  "print(any(\"DeepSpeed's own package\" in str(x.message) for x in w))\n"
                  "print(deepspeed is zero_cpp, deepspeed.__version__)")
    said = present.stdout.strip().splitlines()
    last, err = (said or [""])[-1], (present.stderr or "")[-300:]  # DeepSpeed prints its own lines first
    check(present.returncode == 0 and last.startswith("False 0.") and said[-2] == "True",
          f"with DeepSpeed installed, `import deepspeed` beside zero_cpp is DeepSpeed, and initialize warns that names imported from it are DeepSpeed's ({last[-80:]} {err})")


def main():
    deepspeed.init_distributed()
    sys.exit(finish((test_deepspeed_submodule_imports, test_monitor_tensorboard, test_monitor_csv, test_deepspeed_config, test_throughput_timer,
                     test_engine_timers, test_memory_breakdown, test_engine_and_comm_odds, test_comms_logger, test_config_scheduler, test_config_errors, test_activation_checkpointing,
                     test_flops_profiler_in_the_engine), between=dist.barrier))


if __name__ == "__main__":
    main()
