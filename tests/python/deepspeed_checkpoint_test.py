"""A checkpoint DeepSpeed 0.19.8 saved, converted for zero_cpp and loaded by
its engine, with DeepSpeed itself as the oracle, on 2 ranks:

    zero-run -n 2 -- python deepspeed_checkpoint_test.py TMPDIR

First DeepSpeed trains a small model 3 steps at stages 0-3 in fp32 (and
stage 1 in bf16, stages 0 and 3 in fp16), saves a checkpoint with a
client_state and a WarmupLR scheduler (once with torch's AdamW and LambdaLR
given in code instead), records its fp32 masters, and goes on 3 steps.
It runs as its own job (this script with --deepspeed, launched by rank 0
through the same zero-run): DeepSpeed's stage 3 replaces torch's linear for
the whole process, which zero_cpp's stage 3 must not run under.

Then each checkpoint is converted (zero_cpp.deepspeed_checkpoint, on rank
0, given the loading engine's model and param groups as
engine.load_checkpoint would) and loaded into a zero_cpp engine built over
other initial weights, at the stage DeepSpeed ran and at another: the fp32
masters equal DeepSpeed's bit for bit, the frozen params and buffers its
module's, the step count, lr, loss scale and client_state come back, and the
next 3 steps' losses are DeepSpeed's (fp32: 1e-6 relative at the same
stage). The model has what makes the conversion work: odd-sized params
(ZeRO-1/2's group padding, ZeRO-3's per-param padding), two param groups
(with the frozen params in them, as model.parameters() passes them), a
tied embedding and head, a frozen Linear, a float and an integer buffer and
a non-persistent one; stage 1 saves with elastic_checkpoint, stage 2 with
round_robin_gradients (another flat order).

Every check prints "ok" or "FAIL" (rank 0); the exit status is the number of
failures.
"""
import os
import subprocess
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from checks import check, finish

TMP = sys.argv[1]
VOCAB, D, SEQ, HIDDEN, MICRO = 61, 30, 12, 71, 4
SAVED_AT, MORE = 3, 3
# (name, stage, precision) of each DeepSpeed run; "client": the optimizer
# and LR scheduler given in code (torch's AdamW and LambdaLR), not the config.
CASES = [("fp32_stage0", 0, "fp32"), ("fp32_stage1", 1, "fp32"), ("fp32_stage2", 2, "fp32"),
         ("fp32_stage3", 3, "fp32"), ("bf16_stage1", 1, "bf16"), ("fp16_stage0", 0, "fp16"),
         ("fp16_stage3", 3, "fp16"), ("client_stage3", 3, "fp32")]
# Continued losses against DeepSpeed's: fp32 at the same stage, fp32 at
# another (another reduction order), 16-bit (its roundings, 2^-9 for bf16).
FP32_REL, OTHER_STAGE_REL, HALF_REL = 1e-6, 1e-5, 5e-3
CLIENT_STATE = {"data_position": SAVED_AT, "note": ["resume", 1.5], "ids": torch.arange(5)}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        nn.init.normal_(self.emb.weight, std=0.1)
        self.pos = nn.Parameter(torch.randn(SEQ, D) * 0.02)
        self.frozen = nn.Linear(D, D)
        self.frozen.requires_grad_(False)
        self.ln = nn.LayerNorm(D)
        self.fc1 = nn.Linear(D, HIDDEN)  # 71: odd
        self.fc2 = nn.Linear(HIDDEN, D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.full((D,), 0.5))
        self.register_buffer("order", torch.arange(SEQ))
        self.register_buffer("mask", torch.ones(D), persistent=False)  # DeepSpeed does not save it

    def forward(self, idx, targets):
        x = self.emb(idx) + self.pos[self.order[: idx.shape[1]]]
        x = x + self.frozen(x) * (self.scale * self.mask).to(x.dtype)  # buffers stay fp32 under DeepSpeed's bf16
        x = x + self.fc2(F.gelu(self.fc1(self.ln(x))))
        return F.cross_entropy(self.head(x).float().reshape(-1, VOCAB), targets.reshape(-1))


def param_groups(model):
    """Two groups, frozen params among them (as model.parameters() passes them)."""
    params = list(model.parameters())
    return [{"params": [p for p in params if p.dim() >= 2]},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def config(stage, precision):
    zero = {"stage": stage, "stage3_param_persistence_threshold": 0}
    if stage == 1:
        zero["elastic_checkpoint"] = True  # the optimizer state saved per group, without padding
    if stage == 2:
        zero["round_robin_gradients"] = True  # the flat buffer's params reordered across ranks
    c = {"train_micro_batch_size_per_gpu": MICRO, "gradient_clipping": 1.0, "steps_per_print": 1000,
         "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1, "torch_adam": True}},
         "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3,
                                                       "warmup_num_steps": 5}},
         "zero_optimization": zero}
    if precision == "bf16":
        c["bf16"] = {"enabled": True}
    if precision == "fp16":
        c["fp16"] = {"enabled": True, "initial_scale_power": 8}
    return c


def build(library, name, stage, precision, seed):
    torch.manual_seed(seed)
    model = Net()
    c = config(stage, precision)
    if not name.startswith("client"):
        engine, _, _, _ = library.initialize(model=model, model_parameters=param_groups(model), config=c)
        return engine
    del c["optimizer"], c["scheduler"]
    engine, _, _, _ = library.initialize(
        model=model, optimizer=torch.optim.AdamW(param_groups(model), lr=2e-3, weight_decay=0.05), config=c,
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s)))
    return engine


def train(engine, first, steps):
    losses = []
    for step in range(first, first + steps):
        g = torch.Generator().manual_seed(step)
        tokens = torch.randint(0, VOCAB, (MICRO * engine.world_size, SEQ + 1), generator=g)
        mine = tokens[engine.global_rank * MICRO:(engine.global_rank + 1) * MICRO]
        loss = engine(mine[:, :-1], mine[:, 1:])
        engine.backward(loss)
        engine.step()
        t = loss.detach().float().clone()
        dist.all_reduce(t)
        losses.append(t.item() / engine.world_size)
    return losses


def trainable_names(engine):
    return [n for n, p in engine.module.named_parameters() if p.requires_grad]


# ---- DeepSpeed's run: the checkpoints and what they must load as ----
def deepspeed_masters(engine, stage, precision):
    """Each trainable param's fp32 master in the live DeepSpeed engine."""
    from deepspeed.utils import safe_get_full_fp32_param
    trainable = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
    if precision == "fp32" and stage < 3:
        # The module's params are the masters (safe_get_full_fp32_param under
        # round_robin_gradients returns another param's values in 0.19.8).
        return {n: p.detach().clone() for n, p in trainable}
    if stage == 0:  # the fp16 wrapper's fp32 copies, group by group beside the module's params
        opt = engine.optimizer
        copies = {id(p): m for low, high in zip(opt.fp16_groups, opt.fp32_groups) for p, m in zip(low, high)}
        return {n: copies[id(p)].detach().clone() for n, p in trainable}
    return {n: safe_get_full_fp32_param(p) for n, p in trainable}


def deepspeed_phase():
    import deepspeed
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    for name, stage, precision in CASES:
        engine = build(deepspeed, name, stage, precision, seed=0)
        train(engine, 0, SAVED_AT)
        engine.save_checkpoint(os.path.join(TMP, "deepspeed", name), client_state=CLIENT_STATE)
        masters = deepspeed_masters(engine, stage, precision)
        lr, scale = engine.get_lr()[0], engine.optimizer.loss_scale if precision == "fp16" else None
        losses = train(engine, SAVED_AT, MORE)
        if dist.get_rank() == 0:
            torch.save({"masters": masters, "lr": lr, "loss_scale": scale, "losses": losses},
                       os.path.join(TMP, f"{name}.oracle.pt"))
    dist.destroy_process_group()  # a Gloo group left up can abort at exit (pytorch/pytorch#190489)


# ---- zero_cpp's side ----




def rel(a, b):
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def run_deepspeed_phase():
    """DeepSpeed's job, under the zero-run that launched this one (this
    process's parent); every rank learns whether it worked."""
    ok = torch.zeros(1)
    if dist.get_rank() == 0:
        launcher = os.readlink(f"/proc/{os.getppid()}/exe")
        log = os.path.join(TMP, "deepspeed.log")
        with open(log, "w") as out:
            rc = subprocess.call([launcher, "-n", "2", "--timeout", "240", "--", sys.executable,
                                  os.path.abspath(__file__), TMP, "--deepspeed"], stdout=out, stderr=subprocess.STDOUT)
        if rc != 0:
            with open(log) as f:
                print(f"DeepSpeed's run exited with {rc}; its last lines:\n" + "".join(f.readlines()[-25:]), flush=True)
        ok.fill_(rc == 0)
    dist.broadcast(ok, 0)
    return bool(ok.item())


def load_converted(deepspeed, name, stage, precision):
    """A zero_cpp engine over other initial weights, loading DeepSpeed's
    checkpoint `name` as a script does: engine.load_checkpoint(its dir)
    (rank 0 converts it, given the engine's model and param groups, the
    ranks meet, the engine loads the conversion)."""
    engine = build(deepspeed, name, stage, precision, seed=123)
    path, client = engine.load_checkpoint(os.path.join(TMP, "deepspeed", name))
    return engine, path, client


def check_case(deepspeed, name, stage, precision):
    oracle = torch.load(os.path.join(TMP, f"{name}.oracle.pt"), weights_only=False)
    engine, path, client = load_converted(deepspeed, name, stage, precision)
    ds_dir = os.path.join(TMP, "deepspeed", name)
    with open(os.path.join(ds_dir, "latest")) as f:
        saved_tag = f.read().strip()
    check(path == os.path.join(ds_dir, saved_tag), f"{name}: load_checkpoint returns DeepSpeed's tag ({path})")
    full = engine.consolidated_fp32_state_dict()
    masters = oracle["masters"]
    check(sorted(masters) == sorted(trainable_names(engine)) and
          all(torch.equal(full[n], masters[n]) for n in masters),
          f"{name}: every fp32 master equals DeepSpeed's, bit for bit")
    torch.manual_seed(0)  # frozen params never change: DeepSpeed's are the initial ones, in its precision
    initial = Net().to({"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision])
    m = engine.module  # built from another seed: what equals DeepSpeed's was loaded
    replicated = [(m.frozen.weight, initial.frozen.weight), (m.frozen.bias, initial.frozen.bias),
                  (m.scale, initial.scale), (m.order, initial.order), (m.mask, torch.ones(D))]
    check(all(torch.equal(a.float(), b.float()) for a, b in replicated),
          f"{name}: the frozen params and buffers are DeepSpeed's, the non-persistent buffer the model's")
    check(engine.global_steps == SAVED_AT and abs(engine.get_lr()[0] - oracle["lr"]) <= 1e-12 * oracle["lr"],
          f"{name}: step count {engine.global_steps} and lr {engine.get_lr()[0]} are DeepSpeed's "
          f"({SAVED_AT}, {oracle['lr']})")
    if precision == "fp16":
        check(engine.optimizer.cur_scale == oracle["loss_scale"],
              f"{name}: loss scale {engine.optimizer.cur_scale} is DeepSpeed's ({oracle['loss_scale']})")
    check(client is not None and client["data_position"] == SAVED_AT and client["note"] == CLIENT_STATE["note"] and
          torch.equal(client["ids"], CLIENT_STATE["ids"]) and set(client) == set(CLIENT_STATE),
          f"{name}: client_state comes back as saved (and only it)")
    tol = FP32_REL if precision == "fp32" else HALF_REL
    r = rel(train(engine, SAVED_AT, MORE), oracle["losses"])
    check(r <= tol, f"{name}: the next {MORE} losses are DeepSpeed's (within {r:.1e} relative, <= {tol:g})")
    if precision == "fp32":
        other = (stage + 2) % 4
        converted = os.path.join(ds_dir, "zero_cpp_converted", saved_tag, "manifest.json")
        before = os.stat(converted).st_mtime_ns
        engine, _, _ = load_converted(deepspeed, name, other, precision)
        check(os.stat(converted).st_mtime_ns == before,
              f"{name}: loaded again (same files, same model and groups), the conversion is reused")
        r = rel(train(engine, SAVED_AT, MORE), oracle["losses"])
        check(r <= OTHER_STAGE_REL, f"{name} loaded at stage {other}: the next {MORE} losses are DeepSpeed's "
                                    f"(within {r:.1e} relative, <= {OTHER_STAGE_REL:g})")


def check_reconversion(deepspeed):
    """A checkpoint file rewritten since its conversion: converted again
    (every rank loads)."""
    ds = os.path.join(TMP, "deepspeed", "fp32_stage0")
    with open(os.path.join(ds, "latest")) as f:
        tag = f.read().strip()
    manifest = os.path.join(ds, "zero_cpp_converted", tag, "manifest.json")
    before = os.stat(manifest).st_mtime_ns
    if dist.get_rank() == 0:
        source = os.path.join(ds, tag, sorted(os.listdir(os.path.join(ds, tag)))[0])
        os.utime(source, ns=(os.stat(source).st_atime_ns, os.stat(source).st_mtime_ns + 10**9))
    dist.barrier()
    load_converted(deepspeed, "fp32_stage0", 0, "fp32")
    check(os.stat(manifest).st_mtime_ns != before, "a DeepSpeed checkpoint whose files changed is converted again")


def check_errors():
    from zero_cpp.deepspeed_checkpoint import (DeepSpeedCheckpointError, convert_deepspeed_checkpoint,
                                               is_deepspeed_checkpoint)
    ds = os.path.join(TMP, "deepspeed", "fp32_stage0")
    converted = os.path.join(ds, "zero_cpp_converted")  # where engine.load_checkpoint converted it
    check(is_deepspeed_checkpoint(ds) and not is_deepspeed_checkpoint(converted),
          "is_deepspeed_checkpoint tells DeepSpeed's checkpoint from zero-cpp's")
    # The command line, for the C++ engine's users: DeepSpeed's stage-3 checkpoint into zero-cpp's format.
    out = os.path.join(TMP, "cli")
    run = subprocess.run([sys.executable, "-m", "zero_cpp.deepspeed_checkpoint",
                          os.path.join(TMP, "deepspeed", "fp32_stage3"), out], capture_output=True, text=True)
    check(run.returncode == 0 and os.path.isfile(os.path.join(out, "latest")) and not is_deepspeed_checkpoint(out),
          f"python -m zero_cpp.deepspeed_checkpoint DIR OUT writes a zero-cpp checkpoint ({run.stderr[-200:]})")
    try:  # stage 0 numbers its optimizer state by position in two param groups: without them, named as missing
        convert_deepspeed_checkpoint(ds, None, os.path.join(TMP, "unnamed"), "converted")
        said = ""
    except DeepSpeedCheckpointError as e:
        said = str(e)
    check("param_groups" in said and "2 param groups" in said,
          f"a stage-0 checkpoint of two param groups converted without them is an error that says so: {said[:150]}")


def main():
    if "--deepspeed" in sys.argv:
        deepspeed_phase()
        return 0
    import zero_cpp as deepspeed
    torch.set_num_threads(1)
    deepspeed.init_distributed()
    if run_deepspeed_phase():
        for name, stage, precision in CASES:
            check_case(deepspeed, name, stage, precision)
        check_reconversion(deepspeed)
        if dist.get_rank() == 0:
            check_errors()
    else:
        check(False, "DeepSpeed's run (the oracle) finished")
    return finish(())


if __name__ == "__main__":
    sys.exit(main())
