"""One training script for DeepSpeed 0.19.8 and zero_cpp, the import the
only difference (ZERO_FRONTEND=deepspeed|zero_cpp), as a user switches.
Every scenario at every stage runs in one process (a rank of `zero-run -n
2`); rank 0 writes {scenario: {stage: [loss per step]}} to OUT (and, for
zero_cpp, the collectives counted). tests/python/compare_parity.py holds
the two files to the issue's tolerances.

The model is a small GPT-like net of stock layers with what users' models
have: an embedding tied to the head, a param owned by the root, a frozen
Linear, a buffer used in forward, a block owning a param beside its
sub-modules (nested units at stage 3), LayerNorms; scenario "stock" trains
a model of torch.nn's own layers only (StockNet).

    zero-run -n 2 -- python parity_train.py OUT CKPT_DIR [SCENARIO ...]
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

if os.environ.get("ZERO_FRONTEND", "zero_cpp") == "deepspeed":
    import deepspeed
else:
    import zero_cpp as deepspeed

VOCAB, D, SEQ, LAYERS = 64, 32, 16, 2
MICRO = 4


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(d))  # its own param beside its children's
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.gain * self.fc2(F.gelu(self.fc1(self.ln(x))))


class Moe(nn.Module):
    """A mixture of experts whose experts run in an order that differs by
    rank (a router's order is the data's): a z3 leaf, gathered whole, as
    DeepSpeed's default leaf_module classes (Hugging Face's sparse MoE
    blocks) are. Per-expert units would gather in different orders."""

    def __init__(self, d, experts=3):
        super().__init__()
        self.experts = nn.ModuleList([nn.Linear(d, d) for _ in range(experts)])

    def forward(self, x):
        n = len(self.experts)
        out = x
        for i in ((k + torch.distributed.get_rank()) % n for k in range(n)):
            out = out + 0.1 * torch.tanh(self.experts[i](x))
        return out


class Net(nn.Module):
    def __init__(self, recompute=None, moe=False):
        super().__init__()
        self.recompute = recompute  # None, or torch.utils.checkpoint's use_reentrant for each block
        self.emb = nn.Embedding(VOCAB, D)
        nn.init.normal_(self.emb.weight, std=0.1)
        self.pos = nn.Parameter(torch.randn(SEQ, D) * 0.02)
        self.frozen = nn.Linear(D, D)
        self.frozen.requires_grad_(False)
        self.blocks = nn.ModuleList([Block(D) for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.emb.weight  # tied
        # Values bf16 cannot hold, used in fp32 as a rotary table is: DeepSpeed leaves buffers in their dtype.
        self.register_buffer("scale", torch.linspace(0.3, 0.7, D))
        self.moe = Moe(D) if moe else None

    def forward(self, idx, targets):
        x = self.emb(idx) + self.pos[: idx.shape[1]]
        x = x + (self.frozen(x).float() * self.scale).to(x.dtype)
        for b in self.blocks:
            if self.recompute is None:
                x = b(x)
            else:
                x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=self.recompute)
        if self.moe is not None:
            x = self.moe(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))


def config(stage, gas=1, clip=0.0, warmup=False, bf16=False, autocast=None):
    c = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": gas,
         "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1, "torch_adam": True}},
         "zero_optimization": {"stage": stage, "stage3_param_persistence_threshold": 0},
         "steps_per_print": 1000}
    if clip:
        c["gradient_clipping"] = clip
    if warmup:
        c["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 3e-3,
                                                          "warmup_num_steps": 4}}
    if bf16:
        c["bf16"] = {"enabled": True}
    if autocast is not None:
        c["torch_autocast"] = autocast
    return c


def batch(step, micro_index, rank, world):
    """This rank's micro-batch `micro_index` of global step `step`: the same
    tokens under either front end."""
    g = torch.Generator().manual_seed(1000 * step + micro_index)
    tokens = torch.randint(0, VOCAB, (MICRO * world, SEQ + 1), generator=g)
    mine = tokens[rank * MICRO:(rank + 1) * MICRO]
    return mine[:, :-1], mine[:, 1:]


def build(stage, seed=0, **kw):
    torch.manual_seed(seed)
    model = Net()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config(stage, **kw))
    return engine


def mean_over_ranks(loss):
    t = loss.detach().float().clone()
    torch.distributed.all_reduce(t)
    return t.item() / torch.distributed.get_world_size()


def train(engine, steps, first_step=0):
    rank, world = engine.global_rank, engine.world_size
    gas = engine.gradient_accumulation_steps()
    losses = []
    for step in range(first_step, first_step + steps):
        total = 0.0
        for m in range(gas):
            x, y = batch(step, m, rank, world)
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
            total += mean_over_ranks(loss)
        losses.append(total / gas)
    return losses


def scenario_base(stage, out, ckpt):
    engine = build(stage)
    losses = train(engine, 6)
    # deepspeed.utils.safe_get_full_fp32_param after training, each param's
    # norm (None where DeepSpeed keeps no fp32 master: frozen params, and
    # every param of its stage 0 in fp32).
    norms = {}
    for name, p in engine.module.named_parameters():
        full = deepspeed.utils.safe_get_full_fp32_param(p)
        norms[name] = None if full is None else [list(full.shape), full.double().norm().item()]
    # One more step: safe_get_full_grad between its backward and its step,
    # safe_get_full_optimizer_state after it -- each trainable param's norm.
    x, y = batch(6, 0, engine.global_rank, engine.world_size)
    engine.backward(engine(x, y))
    trainable = [(n, p) for n, p in engine.module.named_parameters() if p.requires_grad]
    state = {"grad": {n: _norm(deepspeed.utils.safe_get_full_grad(p)) for n, p in trainable}}
    engine.step()
    for key in ("exp_avg", "exp_avg_sq"):
        state[key] = {n: _norm(deepspeed.utils.safe_get_full_optimizer_state(p, key)) for n, p in trainable}
    return {"losses": losses, "fp32_params": norms, "full_state": state}


def _norm(t):
    return None if t is None else [list(t.shape), t.double().norm().item()]


def scenario_features(stage, out, ckpt):
    # Gradient accumulation, clipping and a WarmupLR schedule together.
    engine = build(stage, gas=2, clip=0.5, warmup=True)
    losses = train(engine, 6)
    return {"losses": losses, "lr": engine.get_lr()[0], "global_steps": engine.global_steps}


def scenario_bf16(stage, out, ckpt):
    # DeepSpeed 0.19.8's bf16 at stage 0 leaves the model in fp32 on the CPU
    # accelerator (a LayerNorm then sees fp32 inputs against bf16 weights
    # and fails): stages 1-3 only.
    if stage == 0:
        return None
    return {"losses": train(build(stage, bf16=True), 6)}


def scenario_autocast(stage, out, ckpt):
    # The ds_config's torch_autocast: fp32 params, the forward under
    # torch.autocast in bf16 (the frozen Linear and the tied head too),
    # with accumulation and clipping.
    # The losses barely tell an fp32 forward from this one (~1e-4 apart):
    # the dtypes the Linears compute in are recorded too.
    engine = build(stage, gas=2, clip=1.0, autocast={"enabled": True, "dtype": "bfloat16"})
    seen = set()
    for name in ("blocks.0.fc1", "frozen", "head"):
        engine.module.get_submodule(name).register_forward_hook(
            lambda m, i, o, name=name: seen.add(f"{name}:{o.dtype}"))
    losses = train(engine, 6)
    return {"losses": losses, "computed_in": sorted(seen), "autocast": [engine.torch_autocast_enabled(), str(engine.torch_autocast_dtype()),
                                           engine.torch_autocast_lower_precision_safe_modules()],
            "param_dtypes": sorted({str(p.dtype) for p in engine.module.parameters()})}


def scenario_client(stage, out, ckpt):
    """The optimizer and the scheduler given in code, as DeepSpeed takes them:
    a torch AdamW over the params, a LambdaLR made by a callable from the
    optimizer the engine gives it."""
    torch.manual_seed(0)
    model = Net()
    c = config(stage)
    del c["optimizer"]
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)
    engine, _, _, sched = deepspeed.initialize(
        model=model, optimizer=opt, config=c,
        lr_scheduler=lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0 / (1 + s)))
    losses = train(engine, 6)
    return {"losses": losses, "lr": engine.get_lr()[0]}


def scenario_groups(stage, out, ckpt):
    """model_parameters as param groups: no weight decay and twice the lr on
    biases, norms and the root's own param."""
    torch.manual_seed(0)
    model = Net()
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay}, {"params": rest, "weight_decay": 0.0, "lr": 6e-3}]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=config(stage))
    return {"losses": train(engine, 6), "lrs": engine.get_lr()}


def scenario_knobs(stage, out, ckpt):
    """Stage 3's knobs at values that make them act: a prefetch bucket of
    one small module, few live params, no reuse, small modules persistent."""
    torch.manual_seed(0)
    model = Net()
    c = config(stage)
    c["zero_optimization"].update({"stage3_prefetch_bucket_size": 600, "stage3_max_live_parameters": 5000,
                                   "stage3_max_reuse_distance": 0, "stage3_param_persistence_threshold": 100})
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=c)
    return {"losses": train(engine, 5)}


def scenario_recompute(stage, out, ckpt):
    """Activation checkpointing as torch does it, each block recomputed in
    backward: non-reentrant (torch's recommended kind) for three steps, then
    reentrant for three (a recomputed unit at stage 3 is gathered again
    inside the backward and kept for its own backward)."""
    losses = []
    for reentrant in (False, True):
        torch.manual_seed(0)
        model = Net(recompute=reentrant)
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(stage))
        losses += train(engine, 3)
    return {"losses": losses}


def scenario_eval(stage, out, ckpt):
    """Train, then evaluate in eval mode under no_grad through the engine."""
    engine = build(stage)
    train(engine, 3)
    engine.eval()
    with torch.no_grad():
        x, y = batch(99, 0, engine.global_rank, engine.world_size)
        loss = engine(x, y)
    engine.train()
    return {"losses": [mean_over_ranks(loss)]}


def scenario_resume(stage, out, ckpt):
    """Save after 3 steps; a fresh engine over other initial weights loads
    it and continues: its losses are the straight run's."""
    engine = build(stage, gas=2, warmup=True)
    first = train(engine, 3)
    path = os.path.join(ckpt, f"stage{stage}")
    engine.save_checkpoint(path, client_state={"data_position": 3, "note": ["anything", 1.5]})
    straight = train(engine, 3, first_step=3)
    fresh = build(stage, seed=123, gas=2, warmup=True)
    load_path, client = fresh.load_checkpoint(path)
    resumed = train(fresh, 3, first_step=3)
    # DeepSpeed's client state holds its own entries too (tensors among them).
    client = {k: client[k] for k in ("data_position", "note") if k in client}
    return {"losses": first + straight, "resumed": resumed, "client_state": client,
            "loaded": load_path is not None, "global_steps": fresh.global_steps}


def _multi_backward(stage, coalesce):
    """Two backward calls per optimizer step (the micro-batch in two chunks),
    the last marked as the boundary, as GradCache-style losses run them;
    inside coalesce_grad_reduction when `coalesce`."""
    engine = build(stage, gas=1)
    rank, world = engine.global_rank, engine.world_size
    before = engine.comm_counts() if hasattr(engine, "comm_counts") else None
    losses = []
    for step in range(5):
        x, y = batch(step, 0, rank, world)
        chunks = list(zip(x.chunk(2), y.chunk(2)))
        total = 0.0
        with engine.coalesce_grad_reduction() if coalesce else _nothing():
            for k, (cx, cy) in enumerate(chunks):
                engine.set_gradient_accumulation_boundary(k == len(chunks) - 1)
                loss = engine(cx, cy) / len(chunks)
                engine.backward(loss)
                total += mean_over_ranks(loss)
        engine.step()
        losses.append(total)
    calls = None
    if before is not None:  # zero_cpp counts its collectives
        after = engine.comm_counts()
        calls = after.get("reduce_scatter", {}).get("calls", 0) - before.get("reduce_scatter", {}).get("calls", 0)
    return losses, calls


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def scenario_coalesce(stage, out, ckpt):
    if stage == 0:  # DeepSpeed: stages 1-3 (stage 0's no_sync already defers)
        return None
    losses, calls = _multi_backward(stage, coalesce=True)
    separate, separate_calls = _multi_backward(stage, coalesce=False)
    return {"losses": losses, "uncoalesced_losses": separate, "reduce_scatters": calls,
            "uncoalesced_reduce_scatters": separate_calls, "steps": 5, "backwards_per_step": 2}


class Encoder(nn.Module):
    """A sentence encoder: token embeddings, blocks, mean pooling, a projection."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        nn.init.normal_(self.emb.weight, std=0.1)
        self.blocks = nn.ModuleList([Block(D) for _ in range(LAYERS)])
        self.proj = nn.Linear(D, D)

    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.proj(x.mean(dim=1))


def _gradcache(stage, coalesce, chunks=4, steps=4):
    """Seed 002's client, as sentence-transformers' CachedMultipleNegativesRankingLoss
    computes it (GradCache): every chunk's embeddings without grad, the
    in-batch contrastive loss on all of them and its grads with respect to
    the embeddings, then each chunk run again with grad and its embeddings'
    cached grads backpropagated, one engine.backward per chunk -- inside
    coalesce_grad_reduction when `coalesce`."""
    torch.manual_seed(7)
    model = Encoder()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config(stage))
    rank, world = engine.global_rank, engine.world_size
    before = engine.comm_counts() if hasattr(engine, "comm_counts") else None
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(500 + step)
        anchors = torch.randint(0, VOCAB, (8 * world, SEQ), generator=g)[rank * 8:(rank + 1) * 8]
        positives = torch.randint(0, VOCAB, (8 * world, SEQ), generator=g)[rank * 8:(rank + 1) * 8]
        a_chunks, p_chunks = anchors.chunk(chunks), positives.chunk(chunks)
        with torch.no_grad():  # pass 1: embeddings only
            reps_a = [engine(c) for c in a_chunks]
            reps_p = [engine(c) for c in p_chunks]
        ra = torch.cat(reps_a).detach().requires_grad_()
        rp = torch.cat(reps_p).detach().requires_grad_()
        scores = 20.0 * F.normalize(ra, dim=-1) @ F.normalize(rp, dim=-1).T
        loss = F.cross_entropy(scores, torch.arange(len(ra)))
        loss.backward()  # grads of the loss with respect to every embedding
        grads_a, grads_p = ra.grad.chunk(chunks), rp.grad.chunk(chunks)
        pieces = list(zip(a_chunks, grads_a)) + list(zip(p_chunks, grads_p))
        with engine.coalesce_grad_reduction() if coalesce else _nothing():
            for k, (c, grad) in enumerate(pieces):  # pass 2: each chunk again, with grad
                engine.set_gradient_accumulation_boundary(k == len(pieces) - 1)
                engine.backward((engine(c) * grad).sum())
        engine.step()
        losses.append(mean_over_ranks(loss))
    calls = None
    if before is not None:
        after = engine.comm_counts()
        calls = after.get("reduce_scatter", {}).get("calls", 0) - before.get("reduce_scatter", {}).get("calls", 0)
    return losses, calls, 2 * chunks, steps


def scenario_gradcache(stage, out, ckpt):
    if stage == 0:
        return None
    losses, calls, n, steps = _gradcache(stage, coalesce=True)
    separate, separate_calls, _, _ = _gradcache(stage, coalesce=False)
    return {"losses": losses, "uncoalesced_losses": separate, "reduce_scatters": calls,
            "uncoalesced_reduce_scatters": separate_calls, "steps": steps, "backwards_per_step": n}


def scenario_surgery(stage, out, ckpt):
    """DeepSpeed's state setters (zero3.rst, "Modifying Partitioned States")
    between steps: every grad halved and one replaced before a step,
    Adam's first moment zeroed and a param's master scaled after it; at
    stage 3 each rank's own part too (its grads doubled, its exp_avg_sq
    doubled, its masters scaled), whatever size that part is."""
    if stage == 0:
        return None  # DeepSpeed's stage 0 in fp32 keeps no fp32 state to set
    utils = deepspeed.utils
    engine = build(stage)
    rank, world = engine.global_rank, engine.world_size
    model = engine.module
    trainable = [p for p in model.parameters() if p.requires_grad]
    losses = train(engine, 2)
    read_back = {}
    for step in range(2, 7):
        x, y = batch(step, 0, rank, world)
        loss = engine(x, y)
        engine.backward(loss)
        if step == 2:
            utils.safe_update_full_grad_vectorized(trainable, lambda g, p: g * 0.5)
            utils.safe_set_full_grad(model.blocks[0].gain, torch.full(tuple(model.blocks[0].gain.ds_shape) if stage == 3
                                                                      else model.blocks[0].gain.shape, 0.01))
            read_back["grad"] = _norm(utils.safe_get_full_grad(model.blocks[0].gain))
        if step == 3 and stage == 3:
            for p in trainable:
                utils.safe_set_local_grad(p, utils.safe_get_local_grad(p) * 2.0)
        engine.step()
        if step == 2:
            for p in trainable:
                utils.safe_set_full_optimizer_state(p, torch.zeros(p.ds_shape if stage == 3 else p.shape), "exp_avg")
            utils.safe_set_full_fp32_param(model.pos, utils.safe_get_full_fp32_param(model.pos) * 0.9)
            read_back["exp_avg"] = _norm(utils.safe_get_full_optimizer_state(model.pos, "exp_avg"))
        if step == 3 and stage == 3:
            for p in trainable:
                utils.safe_set_local_optimizer_state(
                    p, utils.safe_get_local_optimizer_state(p, "exp_avg_sq") * 2.0, "exp_avg_sq")
                utils.safe_set_local_fp32_param(p, utils.safe_get_local_fp32_param(p) * 0.99)
                assert p.ds_tensor.numel() == utils.safe_get_local_fp32_param(p).numel()
        losses.append(mean_over_ranks(loss))
    read_back["pos"] = _norm(utils.safe_get_full_fp32_param(model.pos))
    return {"losses": losses, "read_back": read_back}


class InitNet(nn.Module):
    """Stock layers each initialised by its own constructor: under
    DeepSpeed's zero.Init a parent's later write to a child's param (Net's
    emb init) is lost, the child being partitioned already -- zero_cpp's
    keeps it, so that is left out of the comparison."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.blocks = nn.ModuleList([Block(D) for _ in range(LAYERS)])
        self.ln_f = nn.LayerNorm(D)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx, targets):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return F.cross_entropy(self.head(self.ln_f(x)).float().reshape(-1, VOCAB), targets.reshape(-1))


def scenario_init_bf16(stage, out, ckpt):
    """The model built under zero.Init with a bf16 config (Hugging Face's
    from_pretrained at stage 3): its params are made in bf16, so their
    random init is drawn in bf16, as under DeepSpeed (stage 3 only: below
    it Init does nothing)."""
    if stage != 3:
        return None
    cfg = config(stage, bf16=True)
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        model = InitNet()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return {"losses": train(engine, 4)}


def scenario_batch_warmup(stage, out, ckpt):
    """A batch-size warm-up: set_train_batch_size from 1 to 2 micro-batches
    per step after an odd number of micro-steps (DeepSpeed's next step then
    ends after one: its micro-step count is kept), then
    set_train_micro_batch_size halving the micro-batch."""
    engine = build(stage, gas=1)
    rank, world = engine.global_rank, engine.world_size
    losses, micro = [], 0
    for step in range(7):
        if step == 3:
            engine.set_train_batch_size(2 * MICRO * world)
        if step == 5:
            engine.set_train_micro_batch_size(MICRO // 2)
        mb, total = engine.train_micro_batch_size_per_gpu(), 0.0
        for _ in range(engine.gradient_accumulation_steps()):
            x, y = batch(micro, 0, rank, world)
            micro += 1
            loss = engine(x[:mb], y[:mb])
            engine.backward(loss)
            engine.step()
            total += mean_over_ranks(loss)
        losses.append(total / engine.gradient_accumulation_steps())
    return {"losses": losses, "global_steps": engine.global_steps, "global_samples": engine.global_samples,
            "batch": [engine.train_batch_size(), engine.train_micro_batch_size_per_gpu(),
                      engine.gradient_accumulation_steps()]}


class StockNet(nn.Module):
    """Only torch.nn's own layers, as users build models: MultiheadAttention
    (inside TransformerEncoderLayer) reads its out_proj's weight without
    calling out_proj; BatchNorm updates running-stat buffers in forward; a
    Conv1d; GELU and LayerNorm inside the encoder layer."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        # No bias before a BatchNorm, as usual: BatchNorm's mean removes it, so
        # its grads are rounding noise that Adam would scale to full steps,
        # differently under two engines' summation orders.
        self.conv = nn.Conv1d(D, D, kernel_size=3, padding=1, bias=False)
        self.norm = nn.BatchNorm1d(D)
        self.encoder = nn.TransformerEncoderLayer(D, nhead=4, dim_feedforward=2 * D, dropout=0.0,
                                                  activation="gelu", batch_first=True)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx, targets):
        x = self.emb(idx)
        x = x + self.norm(self.conv(x.transpose(1, 2))).transpose(1, 2)
        mask = nn.Transformer.generate_square_subsequent_mask(idx.shape[1])
        x = self.encoder(x, src_mask=mask, is_causal=True)
        logits = self.head(x)
        return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))


def scenario_stock(stage, out, ckpt):
    torch.manual_seed(0)
    model = StockNet()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config(stage, gas=2, clip=1.0))
    losses = train(engine, 6)
    # BatchNorm's running stats as each rank trained them (DeepSpeed does not
    # sync buffers), in an evaluation forward on every rank's own batch.
    engine.eval()
    with torch.no_grad():
        x, y = batch(100, 0, engine.global_rank, engine.world_size)
        eval_loss = engine(x, y).detach().float().reshape(1)
    per_rank = [torch.zeros(1) for _ in range(engine.world_size)]
    torch.distributed.all_gather(per_rank, eval_loss)
    return {"losses": losses + [t.item() for t in per_rank]}


def scenario_schedule_resumed(stage, out, ckpt):
    """A schedule begun part way (its last_batch_iteration given), as a
    resumed run's config or code sets it: from the config's scheduler block
    (WarmupLR) and built in code (WarmupDecayLR). DeepSpeed's write no lr
    until their first step, so the first step takes the optimizer's lr.
    The lrs each step took, and the losses."""
    if stage not in (0, 3):
        return None
    torch.manual_seed(0)
    model = Net()
    c = config(stage)
    c["scheduler"] = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 2e-3,
                                                     "warmup_num_steps": 8, "last_batch_iteration": 3}}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=c)
    lrs, losses = [], []
    for step in range(4):
        lrs.append(engine.get_lr()[0])
        losses += train(engine, 1, first_step=step)
    torch.manual_seed(0)
    model = Net()
    c = config(stage)
    engine, opt, _, _ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=c,
        lr_scheduler=lambda o: deepspeed.runtime.lr_schedules.WarmupDecayLR(
            o, total_num_steps=12, warmup_min_lr=1e-4, warmup_max_lr=2e-3, warmup_num_steps=4,
            last_batch_iteration=2))
    for step in range(4):
        lrs.append(engine.get_lr()[0])
        losses += train(engine, 1, first_step=step)
    return {"losses": losses, "lrs": lrs}


def scenario_leaf_modules(stage, out, ckpt):
    """The config's zero_optimization.leaf_module (DeepSpeed's z3 leaves by
    class, here by fully qualified name, by module name and by name
    suffix): a mixture of experts whose ranks run their experts in
    different orders trains at stage 3 as one unit."""
    if stage not in (0, 3):
        return None
    torch.manual_seed(0)
    model = Net(moe=True)
    c = config(stage)
    c["zero_optimization"]["leaf_module"] = {"classes": [f"{Moe.__module__}.{Moe.__qualname__}"],
                                             "names": ["blocks.0"], "name_suffixes": "fc2"}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=c)
    leaves = sorted(n for n, m in engine.module.named_modules() if getattr(m, "_z3_leaf", False))
    return {"losses": train(engine, 4), "leaves": leaves}


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(3))


ACCESSORS = (
             "dataloader_drop_last", "optimizer_name", "optimizer_params", "scheduler_name", "scheduler_params",
             "postscale_gradients", "gradient_predivide_factor", "dump_state", "memory_breakdown",
             "zero_optimization_partition_gradients", "zero_optimization_partition_weights", "zero_cpu_offload",
             "zero_use_cpu_optimizer", "zero_reduce_bucket_size", "zero_contiguous_gradients",
             "zero_param_persistence_threshold", "zero_max_live_parameters", "zero_max_reuse_distance",
             "zero_prefetch_bucket_size", "zero_hpz_partition_size", "zero_allgather_bucket_size",
             "zero_reduce_scatter", "zero_allgather_partitions", "zero_round_robin_gradients", "zero_sub_group_size",
             "zero_elastic_checkpoint", "zero_load_from_fp32_weights", "zero_ignore_unused_parameters",
             "fp16_auto_cast", "initial_dynamic_scale", "dynamic_loss_scale_args",
             "checkpoint_tag_validation_enabled", "checkpoint_tag_validation_fail", "load_universal_checkpoint",
             "use_node_local_storage", "zero_overlap_comm", "zero_compute_grad_norm", "zero_nvme_offload_optimizer",
             "zero_partial_offload", "zero_multi_rank_bucket_allreduce", "zero_allgather_sequential",
             "zero_parameter_alignment", "zero_legacy_stage1", "zero_log_trace_cache_warnings",
             "zero_model_persistence_threshold", "zero_module_granularity_threshold", "zero_quantized_weights",
             "zero_quantized_nontrainable_weights", "zero_quantized_gradients",
             "zero_save_muon_momentum_buffer_in_memory", "zero_allow_untested_optimizer",
             "zero_force_ds_cpu_optimizer", "bf16_master_weights_and_gradients", "bf16_optimizer_states",
             "fp16_master_weights_and_gradients", "autotuning_enabled", "flops_profiler_enabled",
             "flops_profiler_recompute_fwd_factor", "flops_profiler_profile_step", "flops_profiler_module_depth",
             "flops_profiler_top_modules", "flops_profiler_detailed", "flops_profiler_output_file",
             "data_efficiency_enabled", "curriculum_learning_enabled", "data_sampling_enabled", "random_ltd_enabled",
             "autotp_size")


def scenario_accessors(stage, out, ckpt):
    """DeepSpeed's engine methods that report its config, for a config that
    sets some of ZeRO's knobs and leaves the rest at their defaults; then
    module_state_dict (frozen params left out) and load_module_state_dict
    (stage 3: the params fetched) of the whole model read inside
    GatheredParameters, halved: the loss of a forward after it. (Not of a
    step: DeepSpeed's next step at stages 1-3 overwrites the params from
    its fp32 masters, which the load did not reach; zero_cpp's trains on
    from the loaded values -- from-deepspeed.md's differences.)"""
    torch.manual_seed(0)
    model = Net()
    c = config(stage, warmup=True)
    c["zero_optimization"].update({"reduce_bucket_size": 1e6, "allgather_bucket_size": 2e6,
                                   "stage3_max_live_parameters": 3e6, "round_robin_gradients": False,
                                   "overlap_comm": stage != 3, "use_multi_rank_bucket_allreduce": False,
                                   "model_persistence_threshold": 1e9, "log_trace_cache_warnings": True})
    c["flops_profiler"] = {"enabled": False, "profile_step": 3, "module_depth": 2, "top_modules": 2, "detailed": False}
    c["zero_allow_untested_optimizer"] = True
    c["dataloader_drop_last"] = True
    c["checkpoint"] = {"tag_validation": "fail"}
    c["fp16"] = {"enabled": False, "loss_scale_window": 500, "hysteresis": 3}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=c)
    values = {name: getattr(engine, name)() for name in ACCESSORS}
    values["communication_data_type"] = str(engine.communication_data_type)
    values["is_map_style_dataset"] = [engine.is_map_style_dataset(d) for d in ([1, 2], iter([1]))]
    values["is_iterable_style_dataset"] = [engine.is_iterable_style_dataset(d) for d in ([1, 2], Stream())]
    losses = train(engine, 2)
    sd = engine.module_state_dict(exclude_frozen_parameters=True)
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        full = {k: v.detach().clone() * 0.5 for k, v in engine.module.state_dict().items()}
    engine.load_module_state_dict({"module": full}, fetch_z3_params=True)
    with torch.no_grad():
        losses.append(mean_over_ranks(engine(*batch(2, 0, engine.global_rank, engine.world_size))))
    return {"losses": losses, "values": values, "module_state_dict": sorted(sd)}


def scenario_offload_states(stage, out, ckpt):
    """DeepSpeed's offload_states / reload_states between training phases
    (zero3.rst's "Offload States"), mid-accumulation: two states, then the
    rest, reloaded, training on -- the losses those of DeepSpeed's run.
    Stages 1-2: DeepSpeed's stage 0 has no offload_states, its stage 3's
    takes only its FusedAdam (python_frontend holds stages 0 and 3 to a run
    that never offloaded)."""
    if stage not in (1, 2):
        return None
    states = deepspeed.runtime.zero.offload_config.OffloadStateTypeEnum
    engine = build(stage, gas=2)
    losses = train(engine, 3)
    x, y = batch(3, 0, engine.global_rank, engine.world_size)
    engine.backward(engine(x, y))  # a micro-step's grads accumulated, then offloaded
    engine.offload_states(include=[states.optim_states, states.lp_grads])
    engine.offload_states()
    engine.reload_states()
    x, y = batch(3, 1, engine.global_rank, engine.world_size)
    engine.backward(engine(x, y))
    engine.step()
    return {"losses": losses + train(engine, 2, first_step=4)}


def scenario_trackers(stage, out, ckpt):
    """The ds_config's wandb and comet monitors, their clients replaced by
    recorders (tests/python/fake_trackers): every call the engine makes of
    each -- wandb.init's and comet_ml.start's arguments, the events and
    their steps, Comet's samples_log_interval -- and a script's own event
    through engine.monitor. Only rank 0 may call them."""
    if stage not in (0, 3):
        return None
    fakes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_trackers")
    if fakes not in sys.path:
        sys.path.insert(0, fakes)
    import comet_ml
    import wandb
    wandb.calls.clear()
    comet_ml.calls.clear()
    torch.manual_seed(0)
    model = Net()
    c = config(stage, warmup=True)
    c["wandb"] = {"enabled": True, "project": "parity", "group": "runs", "team": "zero"}
    c["comet"] = {"enabled": True, "samples_log_interval": 16, "project": "parity", "experiment_name": "run",
                  "online": False, "mode": "create"}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=c)
    losses = train(engine, 6)
    engine.monitor.write_events([("Train/Samples/eval_loss", losses[-1], engine.global_samples)])
    counts = [torch.zeros(1) for _ in range(engine.world_size)]
    torch.distributed.all_gather(counts, torch.tensor([float(len(wandb.calls) + len(comet_ml.calls))]))
    return {"losses": losses, "wandb": list(wandb.calls), "comet": list(comet_ml.calls),
            "calls_per_rank": [int(t.item()) for t in counts]}


def scenario_inference(stage, out, ckpt):
    """DeepSpeed's inference API (its inference tutorial): a model built
    under OnDevice(dtype=bf16) -- the params made by torch.empty, zeros,
    ones and full take it, the rest keep theirs -- then init_inference at
    its default dtype (fp16), and again from a config file merged with
    keyword arguments (bf16, kernel injection off); the losses of forwards
    under no_grad, the dtypes and the engine's state_dict keys. Once (stage
    0: no ZeRO here). (DeepSpeed's tensor_parallel needs a model its AutoTP
    knows -- Hugging Face's -- and stops on this one: python_frontend
    holds zero_cpp's, which runs the model whole, to the plain model.)"""
    if stage != 0:
        return None
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    torch.manual_seed(0)
    with deepspeed.OnDevice(dtype=torch.bfloat16, device="cpu"):
        model = Net()
    made = {n: str(p.dtype) for n, p in model.named_parameters()}
    engine = deepspeed.init_inference(model)
    losses = []
    with torch.no_grad():
        for step in range(2):
            losses.append(mean_over_ranks(engine(*batch(step, 0, rank, world))))
    default = {"module_is_model": engine.module is model, "dtype": str(next(model.parameters()).dtype),
               "keys": sorted(engine.state_dict())[:4]}
    torch.manual_seed(1)
    model = Net()
    path = os.path.join(ckpt, "inference.json")
    if rank == 0:
        os.makedirs(ckpt, exist_ok=True)
        with open(path, "w") as f:
            json.dump({"dtype": "bf16", "max_out_tokens": 64, "tensor_parallel": {"tp_size": 1}}, f)
    torch.distributed.barrier()
    engine = deepspeed.init_inference(model, config=path, replace_with_kernel_inject=False)
    with torch.no_grad():
        for step in range(2):
            losses.append(mean_over_ranks(engine(*batch(step, 0, rank, world))))
    return {"losses": losses, "made_dtypes": made, "default": default,
            "merged": {"dtype": str(engine._config.dtype), "tp_size": engine._config.tensor_parallel.tp_size,
                       "max_out_tokens": engine._config.max_out_tokens}}


def scenario_at_rest(stage, out, ckpt):
    """Stage 3's params read outside GatheredParameters, as scripts written
    for DeepSpeed do (a norm logged, a reference model deep-copied): they
    read as DeepSpeed's at rest, empty tensors; training goes on from the
    same values after."""
    if stage != 3:
        return None
    import copy
    import warnings
    engine = build(stage)
    losses = train(engine, 2)
    model = engine.module
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zero_cpp's says once what was read
        trained = [p for p in model.parameters() if p.requires_grad]
        w = model.blocks[0].fc1.weight
        read = {"norm": float(sum(p.detach().float().norm() ** 2 for p in trained)), "sum": float(w.sum()),
                "data_numel": w.data.numel(), "clone_numel": w.clone().numel(),
                "copy_numels": [p.numel() for p in copy.deepcopy(model.blocks[0]).parameters()]}
    return {"losses": losses + train(engine, 2, first_step=2), "read": read}


class TiledNet(Net):
    """Net with each block's fc1 a deepspeed.zero.TiledLinear (3 rows x 2
    columns of tiles, uneven), its weights copied from a plain Linear of
    `inits` (made outside zero.Init: one made inside is partitioned, and
    DeepSpeed's copy_params_from asserts on its empty weight)."""

    def __init__(self, inits):
        super().__init__()
        for b, init in zip(self.blocks, inits):
            b.fc1 = deepspeed.zero.TiledLinear(D, 4 * D, in_splits=2, out_splits=3, init_linear=init)


def scenario_tiled(stage, out, ckpt):
    """DeepSpeed's memory-centric tiling (zero3.rst): TiledLinear layers,
    each tile a unit at stage 3. (Built under zero.Init, Net's own init
    writes are lost under DeepSpeed's -- from-deepspeed.md's differences --
    so python_frontend holds that build to a plain one.)"""
    cfg = config(stage, warmup=True)
    torch.manual_seed(0)
    model = TiledNet([nn.Linear(D, 4 * D) for _ in range(LAYERS)])
    tiles = sorted(n for n, _ in model.named_parameters() if "linears" in n)[:4]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    return {"losses": train(engine, 4), "tiles": tiles}


class MoeNet(nn.Module):
    """DeepSpeed's MoE tutorial's shape: a Linear made a deepspeed.moe MoE
    layer between stock layers, its l_aux added to the loss."""

    def __init__(self, k, **moe):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.ln = nn.LayerNorm(D)
        self.moe = deepspeed.moe.layer.MoE(hidden_size=D, expert=nn.Sequential(nn.Linear(D, 2 * D), nn.GELU(),
                                                                              nn.Linear(2 * D, D)),
                                           num_experts=4, k=k, **moe)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, idx, targets):
        x = self.emb(idx)
        y, l_aux, _ = self.moe(self.ln(x))
        logits = self.head(x + y)
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1)) + 0.01 * l_aux


def scenario_moe(stage, out, ckpt):
    """DeepSpeed's mixture of experts (its MoE tutorial) at stages 0-2
    (DeepSpeed's refuses stage 3): top-1 with random token selection and
    tokens dropped at capacity 1.0, top-2 with the second expert sampled
    and a Residual MoE, top-3 without dropping; the param groups
    split_params_into_different_moe_groups_for_optimizer makes (the
    tutorial's create_moe_param_groups), and those the engine makes for the
    config's optimizer; the gate's random draws under a seed give
    DeepSpeed's routes, so the same losses."""
    if stage == 3:
        return None
    split_params_into_different_moe_groups_for_optimizer = \
        deepspeed.moe.utils.split_params_into_different_moe_groups_for_optimizer  # the front end's own
    losses, groups = [], []
    for k, moe in ((1, {"capacity_factor": 1.0, "noisy_gate_policy": "RSample"}),
                   (2, {"use_residual": True, "min_capacity": 2}), (3, {"drop_tokens": False})):
        torch.manual_seed(0)
        model = MoeNet(k, **moe)
        params = split_params_into_different_moe_groups_for_optimizer(
            {"params": list(model.parameters()), "name": "parameters"})
        groups.append([(g["name"], g.get("moe", False), len(g["params"])) for g in params])
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config(stage))
        torch.manual_seed(1 + engine.global_rank)  # the gate's draws: the same per rank under either
        losses += train(engine, 3)
        with torch.no_grad():
            engine.eval()
            losses.append(mean_over_ranks(engine(*batch(9, 0, engine.global_rank, engine.world_size))))
            engine.train()
    # The config's optimizer over plain params: the engine makes the expert groups itself.
    torch.manual_seed(0)
    model = MoeNet(1)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=config(stage))
    torch.manual_seed(1 + engine.global_rank)
    losses += train(engine, 2)
    groups.append([(g.get("name"), g.get("moe", False)) for g in engine.optimizer.param_groups])
    return {"losses": losses, "groups": groups}


def scenario_fp16_auto_cast(stage, out, ckpt):
    """fp16 with the config's auto_cast: the engine casts the forward's
    floating-point positional inputs (inside a tuple too) to fp16, keyword
    inputs not; the script's inputs are fp32. Stages 1-3: DeepSpeed's
    stage 0 runs fp16 through its unfused fp16 optimizer, whose losses are
    5e-3 from its own stages 1-3 (and zero_cpp's) after one step."""
    if stage == 0:
        return None
    class Regressor(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))

        def forward(self, inputs, y):
            x, scale = inputs
            assert x.dtype == scale.dtype == torch.float16 and y.dtype == torch.float32, \
                "auto_cast: positional inputs cast, keyword inputs as they are"
            return F.mse_loss((self.net(x) * scale).float(), y)

    torch.manual_seed(0)
    model = Regressor()
    c = config(stage)
    c["fp16"] = {"enabled": True, "auto_cast": True, "initial_scale_power": 8}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=c)
    losses = []
    for step in range(4):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(MICRO * engine.world_size, 8, generator=g)
        y = x.sum(1, keepdim=True).sin()
        r = slice(engine.global_rank * MICRO, (engine.global_rank + 1) * MICRO)
        loss = engine((x[r], torch.full((MICRO, 1), 0.5)), y=y[r])  # y by keyword: kept fp32
        engine.backward(loss)
        engine.step()
        losses.append(mean_over_ranks(loss))
    return {"losses": losses, "auto_cast": engine.fp16_auto_cast()}


# "inference" first: DeepSpeed's torch_autocast engine ("autocast") leaves
# state behind that changes the 16-bit forwards of later models in the same
# process (its inference losses move by ~1e-4 after it).
SCENARIOS = {"inference": scenario_inference, "base": scenario_base, "features": scenario_features, "bf16": scenario_bf16,
             "resume": scenario_resume, "coalesce": scenario_coalesce, "gradcache": scenario_gradcache,
             "client": scenario_client, "groups": scenario_groups, "knobs": scenario_knobs, "eval": scenario_eval,
             "recompute": scenario_recompute, "stock": scenario_stock, "surgery": scenario_surgery,
             "batch_warmup": scenario_batch_warmup, "init_bf16": scenario_init_bf16, "autocast": scenario_autocast,
             "trackers": scenario_trackers, "offload_states": scenario_offload_states,
             "accessors": scenario_accessors, "schedule_resumed": scenario_schedule_resumed,
             "leaf_modules": scenario_leaf_modules, "at_rest": scenario_at_rest,
             "tiled": scenario_tiled, "moe": scenario_moe, "fp16_auto_cast": scenario_fp16_auto_cast}


def main():
    out, ckpt = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or list(SCENARIOS)
    torch.set_num_threads(1)
    deepspeed.init_distributed(dist_backend="gloo")
    results = {}
    for name in names:
        results[name] = {}
        for stage in (0, 1, 2, 3):
            r = SCENARIOS[name](stage, out, ckpt)
            if r is not None:
                results[name][stage] = r
    if torch.distributed.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f, indent=1)
    # As torch.distributed's documentation asks of every script: a Gloo group
    # left up at exit can abort the process in torch's teardown
    # (pytorch/pytorch#190489), which DeepSpeed's runs here did under load.
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
