"""DeepSpeed's memory estimators and timers in the Python front end, on 2
ranks (zero-run -n 2 -- python estimators_test.py TMPDIR), each against
DeepSpeed 0.19.8's own as the oracle:

- runtime.zero.stage_1_and_2 / stage3: the byte counts DeepSpeed's functions
  return, exactly, and the figures of the tables they print, for several
  models and cluster shapes; and the state a real engine holds per rank
  against the estimate for its 2 ranks.
- utils.timer: elapsed times against perf_counter intervals around sleeps,
  and ThroughputTimer's counts, logs and rates against DeepSpeed's driven by
  the same calls.

Every check prints "ok" or "FAIL" (rank 0); the exit status is the number
of failures.
"""
import contextlib
import io
import math
import re
import sys
import time
import types

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import zero_cpp as deepspeed
import zero_cpp.utils.timer as timer
from zero_cpp.runtime.zero import stage3, stage_1_and_2

from checks import check, finish

try:
    import deepspeed as upstream  # the oracle (CI installs it)
    import deepspeed.runtime.zero.stage3 as upstream_stage3
    import deepspeed.runtime.zero.stage_1_and_2 as upstream_stage_1_and_2
    import deepspeed.utils.timer as upstream_timer
    UPSTREAM_ERROR = None
except Exception as e:  # noqa: BLE001
    UPSTREAM_ERROR = f"{type(e).__name__}: {e}"





class Mlp(nn.Module):
    def __init__(self, width=64, layers=4):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.hidden = nn.ModuleList([nn.Linear(width, width) for _ in range(layers)])
        self.out = nn.Linear(width, 1)

    def forward(self, x, y):
        h = torch.tanh(self.inp(x))
        for layer in self.hidden:
            h = torch.tanh(layer(h))
        return F.mse_loss(self.out(h), y)


class TiedLm(nn.Module):
    """An embedding whose weight the head shares (one Parameter), a second
    Parameter object over the embedding's storage, and a frozen block."""

    def __init__(self, vocab=1000, dim=128):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.alias = nn.Linear(dim, vocab, bias=False)
        self.alias.weight = nn.Parameter(self.embed.weight.data)
        self.frozen = nn.Linear(dim, 3 * dim)
        self.frozen.requires_grad_(False)


def models():
    torch.manual_seed(0)
    return {"mlp": Mlp(), "wide mlp": Mlp(width=1024, layers=2), "3M linear": nn.Linear(2048, 1536),
            "tied lm with a frozen block": TiedLm()}


def printed(fn, *args, **kwargs):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        returned = fn(*args, **kwargs)
    return returned, out.getvalue()


def table(text):
    """(header lines, rows of (cpu, gpu, options)) of a printed estimate;
    DeepSpeed 0.19.8 prints its enum's name for "cpu" (OffloadDeviceEnum.cpu),
    its docs show "cpu": options are compared with that and spacing removed."""
    lines = text.splitlines()
    rows = []
    for line in lines[4:]:
        cpu, gpu, options = (part.strip() for part in line.split("|"))
        rows.append((cpu, gpu, options.replace("OffloadDeviceEnum.cpu", "cpu").replace(" ", "")))
    return lines[:4], rows


SHAPES = [(1, 1), (2, 1), (8, 1), (8, 2), (4, 3), (3, 5), (16, 64)]  # (num_gpus_per_node, num_nodes)


def test_estimates_match_deepspeed():
    returned_same, printed_same, seen = [], [], 0
    for name, model in models().items():
        mine2, theirs2 = stage_1_and_2.model_to_params(model), upstream_stage_1_and_2.model_to_params(model)
        mine3, theirs3 = stage3.model_to_params(model), upstream_stage3.model_to_params(model)
        check(mine2 == theirs2 and mine3 == theirs3, f"{name}: model_to_params {mine3} (DeepSpeed's {theirs3})")
        for gpus, nodes in SHAPES:
            for factor in (1.5, 1.0, 2.25):
                kw = dict(num_gpus_per_node=gpus, num_nodes=nodes, additional_buffer_factor=factor)
                for fn, upstream_fn in ((stage_1_and_2.estimate_zero2_model_states_mem_needs_all_live,
                                         upstream_stage_1_and_2.estimate_zero2_model_states_mem_needs_all_live),
                                        (stage3.estimate_zero3_model_states_mem_needs_all_live,
                                         upstream_stage3.estimate_zero3_model_states_mem_needs_all_live)):
                    mine, theirs = printed(fn, model, **kw), printed(upstream_fn, model, **kw)
                    seen += 1
                    if mine[0] is not theirs[0] or table(mine[1]) != table(theirs[1]):
                        printed_same.append(f"{name} {fn.__name__} {kw}:\n{mine[1]}vs DeepSpeed's:\n{theirs[1]}")
    # Cold: parameter counts as floats (as DeepSpeed's docs pass them) and as
    # ints, up to GPT-3's; every option's returned bytes.
    for total, largest in ((2851e6, 32e6), (737_668_096, 32_899_072), (175e9, 1.2e9), (123_457, 999), (0, 0)):
        for gpus, nodes in SHAPES:
            for factor in (1.5, 1.0, 2.25):
                kw = dict(num_gpus_per_node=gpus, num_nodes=nodes, additional_buffer_factor=factor)
                for offload in (True, False):
                    a = stage_1_and_2.estimate_zero2_model_states_mem_needs(total, cpu_offload=offload, **kw)
                    b = upstream_stage_1_and_2.estimate_zero2_model_states_mem_needs(total, cpu_offload=offload, **kw)
                    if a != b or [type(x) for x in a] != [type(x) for x in b]:
                        returned_same.append(f"zero2 {total} {kw} offload={offload}: {a} vs DeepSpeed's {b}")
                    for offload_params in (True, False):
                        for zero_init in (True, False):
                            z = dict(cpu_offload=offload, cpu_offload_params=offload_params, zero_init=zero_init)
                            a = stage3.estimate_zero3_model_states_mem_needs(total, largest, **z, **kw)
                            b = upstream_stage3.estimate_zero3_model_states_mem_needs(total, largest, **z, **kw)
                            if a != b:
                                returned_same.append(f"zero3 {total} {largest} {kw} {z}: {a} vs DeepSpeed's {b}")
                for fn, upstream_fn, args in (
                        (stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold,
                         upstream_stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold, (total,)),
                        (stage3.estimate_zero3_model_states_mem_needs_all_cold,
                         upstream_stage3.estimate_zero3_model_states_mem_needs_all_cold, (total, largest))):
                    mine, theirs = printed(fn, *args, **kw), printed(upstream_fn, *args, **kw)
                    seen += 1
                    if mine[0] is not theirs[0] or table(mine[1]) != table(theirs[1]):
                        printed_same.append(f"{fn.__name__}{args} {kw}:\n{mine[1]}vs DeepSpeed's:\n{theirs[1]}")
    check(not returned_same, "estimate_zero2/zero3_model_states_mem_needs return DeepSpeed's bytes exactly for "
          f"every option, {len(SHAPES)} cluster shapes, 3 buffer factors, 5 model sizes"
          + "".join(f"\n     {s}" for s in returned_same[:5]))
    check(not printed_same, f"the _all_live and _all_cold tables ({seen}) print DeepSpeed's header, per-CPU and "
          "per-GPU figures and options, and return None" + "".join(f"\n{s}" for s in printed_same[:2]))
    _, text = printed(stage3.estimate_zero3_model_states_mem_needs_all_cold, 2851e6, 32e6, num_gpus_per_node=8)
    check("   71.69GB |   0.12GB | offload_param=cpu , offload_optimizer=cpu , zero_init=1" in text.splitlines(),
          "the options read as in DeepSpeed's docs (offload_param=cpu , ...)")

    lm = TiedLm()
    every = sum(p.numel() for p in lm.parameters())  # tied head already once: one Parameter
    check(stage_1_and_2.model_to_params(lm) == every - lm.alias.weight.numel(),
          "a second Parameter over a param's storage is counted once (DeepSpeed's data_ptr rule), "
          "frozen params counted as trainable ones (as DeepSpeed's)")
    with torch.device("meta"):
        meta = Mlp()
    whole = sum(p.numel() for p in meta.parameters())
    check(stage_1_and_2.model_to_params(meta) == whole and stage3.model_to_params(meta) == (whole, 64 * 64 + 64),
          f"a model on the meta device: every param counted ({stage_1_and_2.model_to_params(meta)} of {whole}; "
          f"DeepSpeed's counts {upstream_stage_1_and_2.model_to_params(meta)}: every meta data_ptr is 0)")
    check(deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs_all_live is
          stage3.estimate_zero3_model_states_mem_needs_all_live and
          deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold is
          stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold,
          "deepspeed.runtime.zero.stage3 / .stage_1_and_2 reachable as attributes (as DeepSpeed's)")


def config(stage):
    return {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
            "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0}}


def test_engine_state_within_estimate():
    # The estimator assumes mixed precision: 2 bytes/param of 16-bit params
    # (whole at stage 2; at stage 3 only the largest layer, gathered, 4L)
    # plus 18 bytes/param sharded over the N ranks (16-bit and fp32 grads,
    # fp32 master params, Adam's two moments). An fp32 AdamW engine holds
    # 4 bytes/param of params (whole at stage 2, sharded at stage 3) and,
    # sharded, 4 of grads and 8 of moments (its params are the master). So:
    # stage 2: 12P/N <= grads+master+optimizer <= int(18P/N) per rank, the
    #          whole state <= the estimate + 2P (fp32 params, 16-bit assumed);
    # stage 3: 16P/N <= the whole state <= int(18P/N) <= the estimate
    #          (between steps no layer is gathered).
    # Lower bounds summed over ranks (every param's state somewhere), upper
    # ones on the largest rank.
    n = dist.get_world_size()
    for stage in (2, 3):
        torch.manual_seed(0)
        model = Mlp(width=256)
        total, largest = stage3.model_to_params(model)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(stage))
        g = torch.Generator().manual_seed(dist.get_rank())
        for _ in range(2):
            x = torch.randn(4, 8, generator=g)
            loss = engine(x, x.sum(1, keepdim=True).sin())
            engine.backward(loss)
            engine.step()
        b = engine.state_bytes()
        sharded = b["grads"] + b["master"] + b["optimizer"]
        mine = torch.tensor([sharded, sharded + b["params"]], dtype=torch.float64)
        most, summed = mine.clone(), mine.clone()
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        dist.all_reduce(summed)
        if stage == 2:
            _, gpu = stage_1_and_2.estimate_zero2_model_states_mem_needs(total, n, 1, cpu_offload=False)
            check(summed[0] >= 12 * total and most[0] <= int(18 * total / n) and most[1] <= gpu + 2 * total,
                  f"stage 2, fp32 AdamW on {n} ranks ({total} params): grads+master+optimizer "
                  f"{int(most[0])} bytes per rank within [12P/N, int(18P/N)={int(18 * total / n)}], "
                  f"the whole state {int(most[1])} <= the estimate {gpu} + 2P (state {b})")
        else:
            _, gpu, _ = stage3.estimate_zero3_model_states_mem_needs(total, largest, n, 1, cpu_offload=False,
                                                                     cpu_offload_params=False)
            check(summed[1] >= 16 * total and most[1] <= int(18 * total / n) <= gpu,
                  f"stage 3, fp32 AdamW on {n} ranks ({total} params): the whole state {int(most[1])} bytes per "
                  f"rank within [16P/N, int(18P/N)={int(18 * total / n)}], under the estimate {gpu} (state {b})")
            check(stage3.model_to_params(engine.module) == (total, largest),
                  "model_to_params of the engine's stage-3 module counts the whole model")


def timed_sleeps(t, seconds):
    """(sum of the sleeps, perf_counter seconds around each start..stop)."""
    around = 0.0
    for s in seconds:
        t0 = time.perf_counter()
        t.start()
        time.sleep(s)
        t.stop()
        around += time.perf_counter() - t0
    return sum(seconds), around


def test_wall_clock_timers():
    timers = timer.SynchronizedWallClockTimer()
    slept, around = timed_sleeps(timers("fwd"), [0.02, 0.01, 0.03])
    got = timers("fwd").elapsed(reset=False)
    check(1e3 * slept <= got <= 1e3 * around, f"elapsed() {got:.2f} ms: at least the sleeps ({1e3 * slept:.0f} ms), "
          f"at most the wall time around them ({1e3 * around:.2f} ms)")
    mean = timers("fwd").mean()
    check(10.0 <= mean <= 1e3 * around, f"mean() {mean:.2f} ms: within the shortest sleep and the total")
    means = timers.get_mean(["fwd", "never"], normalizer=2.0)
    check(set(means) == {"fwd"} and math.isclose(means["fwd"], timers("fwd").mean() * 1e3 / 2.0, rel_tol=1e-6),
          "get_mean: the timers that exist, trimmed mean x 1000 / normalizer (DeepSpeed's scale)")
    check(timers("fwd").elapsed() == got and timers("fwd").elapsed() == 0, "elapsed() resets by default")

    t = timers("running")
    t0 = time.perf_counter()
    t.start()
    time.sleep(0.01)
    mid = t.elapsed(reset=False)
    time.sleep(0.01)
    t.stop()
    wall = time.perf_counter() - t0
    total = t.elapsed()
    check(10.0 <= mid <= total and 20.0 <= total <= 1e3 * wall and not t.started_,
          f"a running timer's elapsed() counts up to now and it runs on ({mid:.2f}, then {total:.2f} ms)")

    raised = []
    for fn in (timers("twice").start, timers("twice").start, timers("never started").stop):
        try:
            fn()
        except RuntimeError:
            raised.append(fn)
    check(len(raised) == 2, "starting a started timer and stopping a stopped one raise")
    check(set(timers.get_timers()) == {"fwd", "running", "twice", "never started"}, "get_timers: every timer by name")

    data = [float(x) for x in torch.rand(37, generator=torch.Generator().manual_seed(1))]
    check(all(math.isclose(timer.trim_mean(data, p), float(upstream_timer.trim_mean(data, p)), rel_tol=1e-12)
              for p in (0.0, 0.1, 0.25)) and timer.trim_mean([], 0.1) == 0,
          "trim_mean as DeepSpeed's on 37 values, 0 for none")

    # log(): a line per call on rank 0 (the default), on every rank with [-1];
    # timers never made ("missing") are left out.
    ours, theirs = timer.SynchronizedWallClockTimer(), upstream_timer.SynchronizedWallClockTimer()
    for ts in (ours, theirs):
        for name in ("fwd", "bwd"):
            ts(name).start()
            ts(name).stop()
    lines = {}
    for label, ts, kw in (("ours", ours, {}), ("theirs", theirs, {}), ("all ranks", ours, {"ranks": [-1]}),
                          ("memory", ours, {"memory_breakdown": True})):
        lines[label] = printed(ts.log, ["bwd", "missing", "fwd"], normalizer=2.0, reset=False, **kw)[1]

    def line(rank):
        return re.compile(rf"\[Rank {rank}\] time \(ms\) \| bwd: \d+\.\d\d \| fwd: \d+\.\d\d\n")
    rank = dist.get_rank()
    every_rank = torch.tensor([line(0).fullmatch(lines["ours"]) is not None if rank == 0 else lines["ours"] == "",
                               line(rank).fullmatch(lines["all ranks"]) is not None], dtype=torch.int32)
    dist.all_reduce(every_rank, op=dist.ReduceOp.MIN)
    # DeepSpeed's own comm is not set up here: its line says rank -1.
    check(bool(every_rank.all()) and (rank != 0 or line("(-1|0)").fullmatch(lines["theirs"]) is not None),
          f"log(): DeepSpeed's line on rank 0 only, on every rank with ranks=[-1] ({lines['ours'].strip()!r}, "
          f"DeepSpeed's {lines['theirs'].strip()!r})")
    check(dist.get_rank() != 0 or "| mem_allocated:" in lines["memory"], "log(memory_breakdown=True) adds memory")

    noop = timer.NoopTimer()
    noop("x").start()
    noop("x").stop(record=True)
    check(noop("x").elapsed(reset=False) == 0 and noop("y").mean() == 0 and noop.get_timers() == {}
          and noop.log(["x"]) is None, "NoopTimer times nothing")


def synchronize_calls(cuda_in_use):
    """torch.cuda.synchronize calls made by a wall-clock timer and a
    ThroughputTimer interval, with CUDA taken as initialized or not."""
    calls = []
    real = torch.cuda.synchronize, torch.cuda.is_initialized
    torch.cuda.synchronize, torch.cuda.is_initialized = (lambda *a: calls.append(a)), (lambda: cuda_in_use)
    try:
        t = timer.SynchronizedWallClockTimer()("x")
        t.start()
        t.stop()
        tput = timer.ThroughputTimer(types.SimpleNamespace(enabled=True, synchronized=True), 4, start_step=0)
        tput.start()
        tput.stop(global_step=True)
    finally:
        torch.cuda.synchronize, torch.cuda.is_initialized = real
    return len(calls)


def drive(meters, sleep, steps, accumulation, epoch_at):
    """Drive ThroughputTimers alike, the later ones' intervals nested in the
    earlier ones'; (sum of the sleeps, the wall time around them) per
    optimizer step."""
    per_step = []
    for step in range(steps):
        if step == epoch_at:
            for m in meters:
                m.update_epoch_count()
        slept, t0 = 0.0, time.perf_counter()
        for micro in range(accumulation):
            for m in meters:
                m.start()
            time.sleep(sleep)
            slept += sleep
            for m in reversed(meters):
                m.stop(global_step=micro == accumulation - 1, report_speed=step != 5)
        per_step.append((slept, time.perf_counter() - t0))
    return per_step


def test_throughput_timer():
    counted = ("epoch_count", "micro_step_count", "global_step_count", "batch_size", "start_step", "started")
    cfg = types.SimpleNamespace(enabled=True, synchronized=True)
    logs = {"ours": [], "theirs": []}
    ours = timer.ThroughputTimer(cfg, batch_size=16, steps_per_output=2, logging_fn=logs["ours"].append)
    theirs = upstream_timer.ThroughputTimer(cfg, batch_size=16, steps_per_output=2, logging_fn=logs["theirs"].append)
    check(ours.avg_samples_per_sec() == theirs.avg_samples_per_sec() == -math.inf,
          "ThroughputTimer: -inf samples/sec before any step, as DeepSpeed's")
    per_step = drive([ours, theirs], sleep=0.004, steps=8, accumulation=2, epoch_at=3)
    check(all(getattr(ours, a) == getattr(theirs, a) for a in counted),
          "counts as DeepSpeed's after 8 steps of 2 micro steps and an epoch: "
          + ", ".join(f"{a}={getattr(ours, a)}" for a in counted))

    def where(line):
        return line.split(", RunningAvgSamplesPerSec=")[0]
    check([where(x) for x in logs["ours"]] == [where(x) for x in logs["theirs"]] and len(logs["ours"]) == 2,
          f"the speed reports as DeepSpeed's: every 2 steps once timed, none with report_speed=False (step 6): "
          f"{[where(x) for x in logs['ours']]}")
    keys = re.compile(r"epoch=\d+/micro_step=\d+/global_step=\d+, RunningAvgSamplesPerSec=[\d.e+-]+, "
                      r"CurrSamplesPerSec=[\d.e+-]+, MemAllocated=[\d.]+GB, MaxMemAllocated=[\d.]+GB")
    check(all(keys.fullmatch(x) for x in logs["ours"] + logs["theirs"]), f"with DeepSpeed's fields: {logs['ours'][0]}")

    # Warm-up (start_step=2) is not timed: the 6 steps after it are, each at
    # least its sleeps and at most the wall time around it. Our intervals
    # hold DeepSpeed's (nested), and both lie in the same bounds, so the two
    # totals differ by no more than the time outside the sleeps.
    timed = per_step[2:]
    low, high = sum(s for s, _ in timed), sum(w for _, w in timed)
    check(low <= ours.total_elapsed_time <= high and low <= theirs.total_elapsed_time <= high
          and abs(ours.total_elapsed_time - theirs.total_elapsed_time) <= high - low,
          f"total_elapsed_time {ours.total_elapsed_time:.4f} s (DeepSpeed's {theirs.total_elapsed_time:.4f}) within "
          f"the timed steps' sleeps {low:.4f} and wall time {high:.4f}")
    rate, their_rate = ours.avg_samples_per_sec(), theirs.avg_samples_per_sec()
    check(16 * 6 / high <= rate <= 16 * 6 / low and 16 * 6 / high <= their_rate <= 16 * 6 / low,
          f"avg_samples_per_sec {rate:.1f} (DeepSpeed's {their_rate:.1f}) within 16 samples x 6 steps over the "
          f"wall time and over the sleeps [{16 * 6 / high:.1f}, {16 * 6 / low:.1f}]")

    off = types.SimpleNamespace(enabled=False, synchronized=True)
    quiet, quiet_theirs = timer.ThroughputTimer(off, 8), upstream_timer.ThroughputTimer(off, 8)
    drive([quiet, quiet_theirs], sleep=0.0, steps=3, accumulation=1, epoch_at=-1)
    check(all(getattr(quiet, a) == getattr(quiet_theirs, a) for a in counted) and quiet.global_step_count == 0,
          "disabled (timers.throughput.enabled=false): nothing counted, as DeepSpeed's")
    default = timer.ThroughputTimer(None, None)
    check(default.batch_size == 1 and default.start_step == 2 and default.steps_per_output is None,
          "DeepSpeed's defaults: batch_size None -> 1, start_step 2, no reports")
    on_cpu, on_gpu = synchronize_calls(False), synchronize_calls(True)
    check(on_cpu == 0 and on_gpu == 4, f"the device is synchronized at each end of an interval only where CUDA is "
          f"in use ({on_gpu} calls for 2 intervals), never on the CPU ({on_cpu})")


def main():
    deepspeed.init_distributed()
    torch.set_num_threads(1)
    check(UPSTREAM_ERROR is None, f"DeepSpeed, the oracle, imports ({UPSTREAM_ERROR or upstream.__version__})")
    tests = [test_engine_state_within_estimate]
    if UPSTREAM_ERROR is None:
        tests += [test_estimates_match_deepspeed, test_wall_clock_timers, test_throughput_timer]
    sys.exit(finish(tests))


if __name__ == "__main__":
    main()
