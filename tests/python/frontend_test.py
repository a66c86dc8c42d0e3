"""The Python front end's own behaviour, on 2 ranks (zero-run -n 2 --
python frontend_test.py TMPDIR): zero.Init, GatheredParameters, the data
loader, torch.distributed beside the engine, zero_to_fp32 and the 16-bit
save, and the errors a DeepSpeed user meets -- each named on every rank,
none a hang. Every check prints "ok" or "FAIL" (rank 0); the exit status
is the number of failures.
"""
import atexit
import math
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import zero_cpp as deepspeed
from zero_cpp.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

from checks import check, finish, raises

TMP = sys.argv[1]




def config(stage, **zero):
    return {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 1000,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.0}},
            "zero_optimization": dict({"stage": stage, "stage3_param_persistence_threshold": 0}, **zero)}


class Mlp(nn.Module):
    def __init__(self, width=64, layers=4):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.hidden = nn.ModuleList([nn.Linear(width, width) for _ in range(layers)])
        self.out = nn.Linear(width, 1)

    def forward(self, x, y):
        h = torch.tanh(self.inp(x.to(self.inp.weight.dtype)))  # as a model that may run in bf16 does
        for layer in self.hidden:
            h = torch.tanh(layer(h))
        return F.mse_loss(self.out(h).float(), y)


def data(step, engine):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(4 * engine.world_size, 8, generator=g)
    y = x.sum(1, keepdim=True).sin()
    r = engine.global_rank
    return x[4 * r:4 * (r + 1)], y[4 * r:4 * (r + 1)]


def train(engine, steps, first=0):
    losses = []
    for s in range(first, first + steps):
        loss = engine(*data(s, engine))
        engine.backward(loss)
        engine.step()
        t = loss.detach().clone()
        dist.all_reduce(t)  # torch.distributed beside the engine
        losses.append(t.item() / engine.world_size)
    return losses


def make(stage, model=None, **zero):
    if model is None:
        torch.manual_seed(0)
        model = Mlp()
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                             config=config(stage, **zero))
    return engine




def test_zero_init():
    # Built under zero.Init (stage 3): every module with params of its own
    # is sharded as it is built; the model then trains exactly as one built
    # whole (rank 0's weights on every rank either way).
    cfg = config(3)
    with deepspeed.zero.Init(config_dict_or_path=cfg) as init:
        torch.manual_seed(dist.get_rank())  # ranks build different weights: Init takes rank 0's
        sharded = Mlp()
    check(init.units_sharded == 6, f"zero.Init sharded each module with params of its own as it was built "
          f"({init.units_sharded} of 6: inp, 4 hidden, out)")
    held = make(3, sharded)
    torch.manual_seed(0)
    plain_model = Mlp()
    with torch.no_grad():  # rank 0's weights as zero.Init kept them
        for p in plain_model.parameters():
            dist.broadcast(p, 0)
        torch.manual_seed(dist.get_rank())
        reference = Mlp()
        reference.load_state_dict(plain_model.state_dict())
    whole = make(3, reference)
    a, b = train(held, 4), train(whole, 4)
    check(a == b, f"a model built under zero.Init trains as one built whole ({a[-1]:.6f} vs {b[-1]:.6f})")
    bytes_held = held.state_bytes()["params"]
    full = sum(p.numel() for p in sharded.parameters()) * 4
    check(bytes_held < 0.75 * full, f"stage 3 holds {bytes_held} bytes of params per rank, under the "
          f"model's {full} (shards; a unit gathered only around its use)")


class TiedLm(nn.Module):
    """An embedding tied to the head in the constructor, as transformers'
    models tie theirs (post_init), which from_pretrained builds under
    zero.Init at stage 3."""

    def __init__(self, tie=True):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.mid = nn.Linear(8, 8)
        self.head = nn.Linear(8, 20, bias=False)
        if tie:
            self.head.weight = self.emb.weight

    def forward(self, ids, targets):
        return F.cross_entropy(self.head(torch.tanh(self.mid(self.emb(ids)))).reshape(-1, 20), targets.reshape(-1))


class WritesChildren(nn.Module):
    """transformers' GPT-2 initialisation: `self.apply(self._init_weights)`,
    whose function writes a child's param through its parent's
    named_parameters() (every `c_proj.weight`)."""

    def __init__(self):
        super().__init__()
        self.attn = nn.Module()
        self.attn.c_proj = nn.Linear(8, 8)
        self.head = nn.Linear(8, 2)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        for name, p in m.named_parameters():
            if name == "c_proj.weight":
                p.data.normal_(mean=0.0, std=0.02)

    def forward(self, x, y):
        return F.mse_loss(self.head(self.attn.c_proj(x)).sum(1, keepdim=True), y)


def test_zero_init_of_a_parent_writing_its_children():
    torch.manual_seed(0)
    whole = WritesChildren()
    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=config(3)):
        built = WritesChildren()
    with deepspeed.zero.GatheredParameters(list(built.parameters())):
        same = all(torch.equal(a, b) for a, b in zip(built.parameters(), whole.parameters()))
    check(same, "zero.Init: an init function writing a child's param through its parent (GPT-2's c_proj) keeps "
                "the write, as the model built whole")
    import argparse
    args = argparse.Namespace(local_rank=-1)
    deepspeed.initialize(args=args, model=built, model_parameters=built.parameters(), config=config(3))
    check(args.local_rank == int(os.environ["LOCAL_RANK"]),
          f"initialize(args=...) sets the tutorial's args.local_rank to this process's ({args.local_rank})")


def test_zero_init_of_tied_weights():
    # Tied in the constructor, or after zero.Init: trains, and reads under
    # GatheredParameters, as the same model built whole.
    def tokens(step):
        g = torch.Generator().manual_seed(step)
        ids = torch.randint(0, 20, (4 * dist.get_world_size(), 7), generator=g)
        mine = ids[4 * dist.get_rank():4 * (dist.get_rank() + 1)]
        return mine[:, :-1], mine[:, 1:]

    def run(model):
        e, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(3))
        losses = []
        for step in range(3):
            loss = e(*tokens(step))
            e.backward(loss)
            e.step()
            losses.append(loss.item())
        return losses

    for tie_after in (False, True):
        torch.manual_seed(0)
        whole = TiedLm()
        torch.manual_seed(0)
        with deepspeed.zero.Init(config_dict_or_path=config(3)):
            built = TiedLm(tie=not tie_after)
        if tie_after:
            built.head.weight = built.emb.weight
        with deepspeed.zero.GatheredParameters(list(built.parameters())):
            read = built.head.weight.detach().clone()
        how = "tied after zero.Init" if tie_after else "tied in the constructor under zero.Init"
        check(torch.equal(read, whole.head.weight.detach()),
              f"{how}: the tied weight reads under GatheredParameters as built whole")
        a, b = run(built), run(whole)
        check(a == b, f"{how}: trains as the model built whole ({a} vs {b})")


def test_gathered_parameters():
    engine = make(3)
    train(engine, 2)
    w = engine.module.hidden[1].weight
    with deepspeed.zero.GatheredParameters(w, modifier_rank=0):
        full_before = w.detach().clone()
        if dist.get_rank() == 0:
            with torch.no_grad():
                w.fill_(0.25)
    with deepspeed.zero.GatheredParameters(w):
        seen = w.detach().clone()
    check(bool((seen == 0.25).all()), "GatheredParameters(modifier_rank=0): rank 0's change reaches every rank")
    sd = engine.consolidated_fp32_state_dict()
    check(bool((sd["hidden.1.weight"] == 0.25).all()), "and the fp32 master weights (the consolidated state dict)")
    others = [t.clone() for t in [full_before]]
    dist.all_reduce(others[0])
    check(bool(torch.allclose(others[0], 2 * full_before)), "inside the block every rank held the same full param")
    losses = train(engine, 2, first=2)
    check(all(x == x for x in losses), "training goes on after the blocks")


def test_gathered_parameters_under_init():
    # The Hugging Face pattern: weights initialised under zero.Init, before
    # initialize(), inside GatheredParameters with modifier_rank 0.
    cfg = config(3)
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        torch.manual_seed(0)
        model = Mlp()
    with deepspeed.zero.GatheredParameters(model.out.weight, modifier_rank=0):
        if dist.get_rank() == 0:
            with torch.no_grad():
                model.out.weight.fill_(0.5)
    engine = make(3, model)
    sd = engine.consolidated_fp32_state_dict()
    check(bool((sd["out.weight"] == 0.5).all()), "GatheredParameters before initialize (zero.Init's shards): "
          "rank 0's initialisation is what the engine trains from")

    # Every param at once (a pretrained state dict loaded on rank 0): the
    # units are gathered in one order on every rank, whatever each process's
    # hashing of its modules.
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        torch.manual_seed(dist.get_rank())  # ranks draw apart; rank 0's load is what counts
        model = nn.Sequential(*[nn.Linear(8 + i, 9 + i) for i in range(10)])
    torch.manual_seed(7)
    pretrained = nn.Sequential(*[nn.Linear(8 + i, 9 + i) for i in range(10)]).state_dict()
    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
        if dist.get_rank() == 0:
            model.load_state_dict(pretrained)
    sd = make(3, model).consolidated_fp32_state_dict()
    check(all(torch.equal(sd[k], v) for k, v in pretrained.items()),
          "GatheredParameters over every param of a model zero.Init built: rank 0's load reaches the engine")


def test_init_of_children_by_their_parents():
    # What models do in their constructors after building their children:
    # nanoGPT's and Hugging Face's self.apply(self._init_weights), torch's
    # MultiheadAttention writing its out_proj's bias, TransformerEncoderLayer
    # holding one. Under zero.Init the model is the one built without it on
    # rank 0 (DeepSpeed gathers for Module.apply and keeps rank 0's values).
    class GptLike(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(40, 16)
            self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
            self.block = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
            self.fc = nn.Linear(16, 16)
            self.head = nn.Linear(16, 40, bias=False)
            self.apply(self._init_weights)

        @staticmethod
        def _init_weights(m):
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.constant_(m.bias, 0.125)

        def forward(self, ids):
            x = self.wte(ids)
            x = self.block(x + self.attn(x, x, x, need_weights=False)[0])
            return F.cross_entropy(self.head(torch.tanh(self.fc(x))).view(-1, 40), ids.view(-1))

    torch.manual_seed(11)
    reference = {k: v.clone() for k, v in GptLike().state_dict().items()}
    with deepspeed.zero.Init(config_dict_or_path=config(3)):
        torch.manual_seed(11 + dist.get_rank())  # the ranks draw apart: rank 0's draws are the model
        if dist.get_rank() == 0:
            torch.manual_seed(11)
        model = GptLike()
    engine = make(3, model)
    sd = engine.consolidated_fp32_state_dict()
    differ = [k for k, v in reference.items() if not torch.equal(sd[k], v)]
    check(not differ, f"zero.Init of a model whose constructor initialises its children (apply, "
          f"MultiheadAttention, TransformerEncoderLayer): rank 0's model unsharded (differ: {differ})")
    ids = torch.arange(32).view(4, 8) % 40
    loss = engine(ids)
    engine.backward(loss)
    engine.step()
    check(loss.item() == loss.item(), "and it trains")


def test_module_zero_grad_clears_the_engines_grads():
    # DeepSpeedExamples' GAN: G's backward runs through D (output = netD(fake)),
    # and the loop clears D's grads with netD.zero_grad() on the module, as
    # under DDP and DeepSpeed's stage 0. Those grads must not reach D's next
    # step: the oracle is the same steps with engD.zero_grad().
    def run(clear_with_module):
        torch.manual_seed(7)
        net_g = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 6))
        net_d = nn.Sequential(nn.Linear(6, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
        cfg = {"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 0}}
        eng_d, _, _, _ = deepspeed.initialize(model=net_d, model_parameters=net_d.parameters(), config=cfg,
                                              optimizer=torch.optim.Adam(net_d.parameters(), lr=2e-3))
        eng_g, _, _, _ = deepspeed.initialize(model=net_g, model_parameters=net_g.parameters(), config=cfg,
                                              optimizer=torch.optim.Adam(net_g.parameters(), lr=2e-3))
        g = torch.Generator().manual_seed(100 + dist.get_rank())
        losses = []
        for _ in range(3):
            (net_d if clear_with_module else eng_d).zero_grad()
            real, noise = torch.randn(8, 6, generator=g), torch.randn(8, 4, generator=g)
            fake = net_g(noise)
            err_d = F.softplus(-net_d(real)).mean() + F.softplus(net_d(fake.detach())).mean()
            eng_d.backward(err_d)
            eng_d.step()
            (net_g if clear_with_module else eng_g).zero_grad()
            err_g = F.softplus(-net_d(fake)).mean()
            eng_g.backward(err_g)
            eng_g.step()
            losses.append((err_d.item(), err_g.item()))
        return losses

    by_module, by_engine = run(True), run(False)
    check(by_module == by_engine, f"module.zero_grad() clears the grads the engine holds, as engine.zero_grad() "
          f"({by_module} vs {by_engine})")


def test_module_called_directly_at_stage3():
    # Generation and evaluation helpers call the wrapped model itself
    # (engine.module(x), Hugging Face's generate): the root's own params and
    # a tied embedding and head, which the engine's forward gathers, must be
    # whole there too. The oracle: the same calls through the engine.
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(20, 8)
            self.proj = nn.Linear(8, 8)
            self.head = nn.Linear(8, 20)
            self.emb.weight = self.head.weight  # tied
            self.temp = nn.Parameter(torch.full((1,), 0.9))  # the root's own

        def forward(self, ids):
            return self.head(torch.tanh(self.proj(self.emb(ids)))) / self.temp

    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]])
    torch.manual_seed(0)
    engine = make(3, Tiny())
    for _ in range(2):
        loss = F.cross_entropy(engine(ids).view(-1, 20), ids.roll(1, 1).view(-1))
        engine.backward(loss)
        engine.step()
    engine.eval()
    with torch.no_grad():
        direct, through = engine.module(ids), engine(ids)
    engine.train()
    loss = F.cross_entropy(engine(ids).view(-1, 20), ids.roll(1, 1).view(-1))
    engine.backward(loss)
    engine.step()
    check(torch.equal(direct, through) and loss.item() == loss.item(),
          "stage 3: engine.module(x) called directly gathers the root's params and tied weights, as engine(x)")
    import copy
    import inspect
    import pickle
    plain = nn.Linear(3, 2)
    stage1 = make(1, nn.Sequential(plain))
    twin = copy.deepcopy(stage1.module)
    loaded = pickle.loads(pickle.dumps(stage1.module))
    stage1.backward(stage1(torch.ones(4, 3)).sum())
    twin.zero_grad()
    loaded.zero_grad()
    stage1.step()
    root = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    calls = []
    class_forward = root.forward

    def library_forward(*args, **kwargs):  # accelerate's hooks set one on the instance, as this
        calls.append(1)
        return class_forward(*args, **kwargs)

    root.forward = library_forward
    stage3 = make(3, root)
    stage3(torch.ones(2, 3))
    stage3.module(torch.ones(2, 3))
    check(len(calls) == 2, f"a forward a library set on the model's instance before initialize still runs, through "
          f"the engine and called directly ({calls})")
    check(stage1.get_global_grad_norm() not in (None, 0.0) and torch.equal(twin(torch.ones(1, 3)), loaded(torch.ones(1, 3)))
          and list(inspect.signature(stage1.module.forward).parameters) == ["input"],
          "a deep copy or a pickle of the trained model is a plain model: its zero_grad leaves the engine's grads, "
          "its forward runs itself; the wrapped forward keeps its signature")


def test_stage3_params_say_they_are_partitioned():
    # LLaVA's and FastChat's maybe_zero_3, DeepSpeed-Chat's save helpers:
    # `hasattr(p, "ds_id")` decides whether to gather before reading a param.
    from zero_cpp.runtime.zero.partition_parameters import ZeroParamStatus

    def maybe_zero_3(param):
        if hasattr(param, "ds_id"):
            with deepspeed.zero.GatheredParameters([param]):
                return param.data.detach().cpu().clone()
        return param.detach().cpu().clone()

    with deepspeed.zero.Init(config_dict_or_path=config(3)):
        torch.manual_seed(0)
        built = Mlp()
    check(all(hasattr(p, "ds_id") for p in built.parameters()), "zero.Init's params carry ds_id")
    engine = make(3)
    train(engine, 1)
    params = list(engine.module.named_parameters())
    ids = [p.ds_id for _, p in params]
    statuses = {p.ds_status for _, p in params}
    check(len(set(ids)) == len(ids) and all(p.ds_numel == p.numel() and tuple(p.ds_shape) == tuple(p.shape)
                                           for _, p in params) and statuses == {ZeroParamStatus.NOT_AVAILABLE},
          f"stage 3: every param has its own ds_id, ds_numel, ds_shape, and ds_status NOT_AVAILABLE at rest "
          f"({statuses})")
    w = params[0][1]
    with deepspeed.zero.GatheredParameters([w]):
        inside = w.ds_status
    check(inside == ZeroParamStatus.AVAILABLE and w.ds_status == ZeroParamStatus.NOT_AVAILABLE,
          "ds_status AVAILABLE inside GatheredParameters, NOT_AVAILABLE after")
    sd = engine.consolidated_fp32_state_dict()
    check(all(torch.equal(maybe_zero_3(p), sd[n]) for n, p in params),
          "a maybe_zero_3 helper reads every full param (fp32)")
    from zero_cpp.runtime.zero.utils import is_zero_param
    check(not any(hasattr(p, "ds_id") or is_zero_param(p) for p in make(2).module.parameters()) and
          all(is_zero_param(p) for _, p in params), "below stage 3 no param has ds_id (is_zero_param), at 3 all do")


def test_released_params_read_as_deepspeeds():
    """Stage 3's params outside GatheredParameters (python_parity's
    "at_rest" holds the values to DeepSpeed's): a read gives an empty
    tensor and one warning naming the param, where it stopped the process;
    metadata and a conversion that changes nothing read the param itself;
    a write that would take the engine's storage away (.data =,
    model.half()) is refused naming the param, and nothing changes; the
    run goes on as one that read nothing."""
    import copy
    plain = train(make(3), 4)
    engine = make(3)
    losses = train(engine, 2)
    model = engine.module
    w = model.hidden[0].weight
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        reads = [w.sum().item(), w.norm().item(), w.data.numel(), (w * 2).numel(), torch.cat([w.view(-1)]).numel()]
        again = w.clone().numel()
    ours = [str(x.message) for x in said if "zero_cpp" in str(x.message)]
    check(reads == [0.0, 0.0, 0, 0, 0] and again == 0 and len(ours) == 1 and "'hidden.0.weight'" in ours[0] and
          "GatheredParameters" in ours[0],
          f"a released param reads as an empty tensor, as DeepSpeed's, with one warning naming it ({reads}, {ours})")
    check(tuple(w.shape) == (64, 64) and w.numel() == 4096 and w.dtype == torch.float32 and w.requires_grad and
          w.to("cpu") is w and w.float() is w and model.to("cpu") is model and "tensor([]" in repr(w),
          "its metadata are the param's; a conversion that changes nothing gives the param itself; repr shows "
          "what a read gives")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        views = [w.T.numel(), float(w.T.sum()), w.to(torch.float32, True) is w, model.type(torch.float32) is model]
    check(views == [0, 0.0, True, True], f"views through attributes (.T) read the stand-in too; conversions that "
          f"change nothing, in any argument form, give the param itself ({views})")

    def assign():
        w.data = torch.zeros(64, 64)
    ok, msg = raises(assign, RuntimeError, "'hidden.0.weight'")
    check(ok and "GatheredParameters" in msg, f"assigning .data of a released param is refused, naming it ({msg})")
    ok, msg = raises(model.half, RuntimeError, "model.half()")
    check(ok and all(p.dtype == torch.float32 for p in model.parameters()),
          f"model.half() at rest is refused, nothing cast ({msg})")
    twin = copy.deepcopy(model)
    check(all(p.numel() == 0 and type(p) is nn.Parameter for p in twin.parameters()),
          "a deep copy at rest holds empty plain Parameters, as DeepSpeed's copies are empty")
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        whole = copy.deepcopy(model)
        gathered = w.sum().item()
    x, y = data(9, engine)
    with torch.no_grad():
        check(gathered != 0.0 and whole.hidden[0].weight.sum().item() == gathered and
              torch.isfinite(whole(x, y)) and not any(hasattr(m, "_zero_cpp_unit") for m in whole.modules()),
              "inside GatheredParameters the params read whole; a deep copy made there is a plain model that runs")
    b = model.hidden[0].bias
    with deepspeed.zero.GatheredParameters([w, b]):
        traced = torch._dynamo.explain(lambda x: F.linear(x, w, b))(torch.ones(2, 64))
    check(traced.graph_count == 1 and traced.graph_break_count == 0,
          f"torch.compile traces a function of gathered params into one graph ({traced.graph_count} graphs, "
          f"{traced.graph_break_count} breaks)")
    losses += train(engine, 2, first=2)
    check(losses == plain, f"the run goes on as one that read nothing ({losses} vs {plain})")
    # p.data = value inside GatheredParameters(modifier_rank=0): kept, as DeepSpeed keeps it.
    with deepspeed.zero.GatheredParameters([w], modifier_rank=0):
        w.data = torch.full((64, 64), 0.5)
        ok, msg = raises(lambda: setattr(w, "data", torch.zeros(2)), RuntimeError, "another shape")
    full = engine.consolidated_fp32_state_dict()["hidden.0.weight"]
    check(ok and bool((full == 0.5).all()), f"assigning .data inside GatheredParameters(modifier_rank=0) reaches "
          f"the engine ({float(full.mean())}); another shape is refused ({msg})")


def test_host_copies_of_gathered_params_outlive_the_block():
    # DeepSpeed-Chat's save_zero_three_model: `v.data.cpu()` inside the
    # block, the result read after it. On a GPU `.cpu()` copies; on the host
    # torch returns the tensor itself, a view of pages the block releases.
    engine = make(3)
    train(engine, 2)
    sd = engine.consolidated_fp32_state_dict()
    exported = {}
    for k, v in engine.module.named_parameters():
        with deepspeed.zero.GatheredParameters([v]):
            exported[k] = v.data.cpu() if "hidden" not in k else v.detach().to("cpu")
    check(all(torch.equal(exported[k], sd[k]) for k in sd),
          "stage 3: `v.data.cpu()` / `.to(\"cpu\")` inside GatheredParameters, read after it (DeepSpeed-Chat's export)")
    w = engine.module.inp.weight
    plain = torch.zeros(3)
    with deepspeed.zero.GatheredParameters([w], modifier_rank=0):
        same = plain.cpu() is plain and plain.to("cpu") is plain and w.data.to(torch.float32).data_ptr() == w.data_ptr()
        if dist.get_rank() == 0:
            w.data.fill_(0.25)  # writes through the param itself still reach it
    check(same and torch.Tensor.cpu.__qualname__ == "TensorBase.cpu",
          "only a gathered param moved to the host is copied; other tensors and dtype casts are torch's own, "
          "and torch's methods are back after the block")
    check(torch.equal(engine.consolidated_fp32_state_dict()["inp.weight"], torch.full_like(sd["inp.weight"], 0.25)),
          "modifier_rank's in-place write inside the block reaches the param")


def test_forward_returning_its_own_param():
    # zero3.rst's CustomLinear returns its bias beside its output; the caller
    # adds it after that forward ended. DeepSpeed finds such a param itself.
    class CustomLinear(nn.Linear):
        def forward(self, x):
            return super().forward(x), self.bias

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = CustomLinear(8, 16)
            self.b = nn.Linear(16, 1)

        def forward(self, x, y):
            h, bias = self.a(x)
            return F.mse_loss(self.b(torch.tanh(h + bias)), y)

    losses = {}
    for stage in (0, 3):
        torch.manual_seed(0)
        model = Net()
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(stage))
        losses[stage] = train(engine, 3)
    check(all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(losses[3], losses[0])),
          f"stage 3: a forward returning its own param, used by the caller after it, trains as stage 0 ({losses})")


def test_z3_leaf_modules():
    # A mixture-of-experts block whose experts each rank runs in its own
    # data-dependent order: per-expert units would gather apart on the
    # ranks. Marked a leaf (set_z3_leaf_modules) it is one unit; its losses
    # are stage 0's.
    class Moe(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(8, 3)
            self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
            self.scale = nn.Parameter(torch.full((8,), 0.5))  # the block's own, beside its children's

        def forward(self, x):
            choice = self.gate(x).argmax(-1)
            out = torch.zeros_like(x)
            for e in sorted(set(choice.tolist()), reverse=dist.get_rank() == 1):  # data-dependent, rank-dependent
                mask = choice == e
                out[mask] = self.experts[e](x[mask])
            return out * self.scale

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(4, 8)
            self.moe = Moe()
            self.out = nn.Linear(8, 1)

        def forward(self, x):
            return self.out(torch.tanh(self.moe(torch.tanh(self.inp(x))))).pow(2).mean()

    def losses(stage, leaf, under_init=False):
        torch.manual_seed(3)
        if under_init:
            with deepspeed.zero.Init(config_dict_or_path=config(3)):
                model = Net()
        else:
            model = Net()
        if leaf:
            marked = deepspeed.utils.set_z3_leaf_modules(model, [Moe])
            assert marked == [model.moe] and deepspeed.utils.get_z3_leaf_modules(model) == [model.moe]
        engine = make(stage, model)
        g = torch.Generator().manual_seed(20 + dist.get_rank())
        out = []
        for _ in range(3):
            loss = engine(torch.randn(16, 4, generator=g))
            engine.backward(loss)
            engine.step()
            out.append(loss.item())
        return out

    want, got, built = losses(0, False), losses(3, True), losses(3, True, under_init=True)
    check(max(abs(a - b) for a, b in zip(want, got)) <= 1e-6 * max(map(abs, want)),
          f"set_z3_leaf_modules: an MoE block run in a different expert order per rank trains at stage 3 as one "
          f"unit, as at stage 0 ({got} vs {want})")
    check(max(abs(a - b) for a, b in zip(want, built)) <= 1e-6 * max(map(abs, want)),
          f"and so when zero.Init built it ({built} vs {want})")

    # DeepSpeed's matching: a class matches its subclasses, a string the bare
    # or fully qualified class name; by module name and by name suffix.
    class SubMoe(Moe):
        pass
    model = Net()
    model.moe = SubMoe()
    u = deepspeed.utils
    check(u.set_z3_leaf_modules(model, [Moe]) == [model.moe] and
          u.set_z3_leaf_modules(model, [f"{SubMoe.__module__}.{SubMoe.__qualname__}"]) == [model.moe],
          "set_z3_leaf_modules: a subclass's instance matches its base class, and its fully qualified name")
    u.unset_z3_leaf_modules(model, [Moe])
    marked, missing = u.set_z3_leaf_modules_by_name(model, ["moe", "nope"], raise_if_not_found=False)
    by_suffix, _ = u.set_z3_leaf_modules_by_suffix(model, ["experts.2"])
    check(marked == [model.moe] and missing == ["nope"] and by_suffix == [model.moe.experts[2]] and
          u.get_z3_leaf_modules(model) == [model.moe, model.moe.experts[2]],
          "set_z3_leaf_modules_by_name / _by_suffix mark what they name and report what matched nothing")
    ok, msg = raises(lambda: u.set_z3_leaf_modules_by_name(model, ["nope"]), ValueError, "nope")
    check(ok, f"a name matching no module is a ValueError naming it ({msg})")
    ok, msg = raises(lambda: make(0, Net(), leaf_module={"class": ["Moe"]}), Exception, "leaf_module.class")
    check(ok, f"the config's leaf_module names a key it does not have ({msg})")


def test_dataloader():
    class Squares(torch.utils.data.Dataset):
        def __len__(self):
            return 37

        def __getitem__(self, i):
            return torch.tensor([float(i)])

    torch.manual_seed(0)
    model = Mlp()
    engine, _, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                config=config(1), training_data=Squares())
    seen = torch.cat([b.reshape(-1) for b in loader])
    check(len(loader) == 5 and all(b.shape[0] <= 4 for b in loader),
          f"training_data: micro-batches of train_micro_batch_size_per_gpu, {len(loader)} a rank (19 samples)")
    everyone = [torch.zeros(19) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, seen)
    every = torch.cat(everyone).tolist()
    check(len(every) == 38 and set(every) == set(float(i) for i in range(37)),
          "the ranks' shares cover the dataset (DistributedSampler pads one sample to even them)")


def test_accelerator_logging_and_loaders():
    # What DeepSpeed's tutorials call beside the engine: get_accelerator(),
    # the logger and log_dist, RepeatingLoader, see_memory_usage.
    import io
    import logging
    from zero_cpp.runtime.utils import see_memory_usage

    acc = deepspeed.get_accelerator()
    check(acc is deepspeed.accelerator.get_accelerator(), "deepspeed.get_accelerator is deepspeed.accelerator's")
    torch.manual_seed(0)
    model = Mlp()
    cfg = config(0)
    cfg.update(zero_force_ds_cpu_optimizer=False, sequence_parallel_size=1)  # DeepSpeed's keys, at values it allows
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    check(engine.gradient_clipping() == 1.0, f"no gradient_clipping key: the engine clips at DeepSpeed's default "
          f"1.0 and says so ({engine.gradient_clipping()})")
    offloaded = make(2, offload_optimizer={"device": "cpu"})
    check(not engine.zero_offload_optimizer() and offloaded.zero_offload_optimizer()
          and not offloaded.zero_offload_param() and not engine.wall_clock_breakdown()
          and engine.get_mom() == [engine.optimizer.param_groups[0]["betas"]],
          f"the engine's config accessors (zero_offload_optimizer, zero_offload_param, wall_clock_breakdown, "
          f"get_mom: {engine.get_mom()})")
    check(torch.device(acc.current_device_name()) == engine.device and acc.device_name() == engine.device.type
          and acc.on_accelerator(next(engine.module.parameters())),
          f"the accelerator names the engine's device ({acc.current_device_name()} vs {engine.device})")
    now = acc.memory_allocated()  # first: memory can only grow before the peak is read
    check(acc.communication_backend_name() == ("nccl" if engine.device.type == "cuda" else "gloo")
          and acc.is_available() and acc.total_memory() >= acc.available_memory() > 0
          and acc.max_memory_allocated() >= now > 0,
          "the accelerator's backend name, and its memory figures ordered as they must be")
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    deepspeed.logger.addHandler(handler)
    try:
        deepspeed.utils.log_dist("to rank 1", ranks=[1])
        deepspeed.utils.log_dist("to every rank", ranks=[-1])
        deepspeed.utils.log_dist("to no rank")
        see_memory_usage("not forced")
        see_memory_usage("after initialize", force=True)
    finally:
        deepspeed.logger.removeHandler(handler)
    got = lines.getvalue().splitlines()
    r = dist.get_rank()
    want = ([f"[Rank {r}] to rank 1"] if r == 1 else []) + [f"[Rank {r}] to every rank"]
    memory = [line for line in got if line.startswith("after initialize")]
    ok = [line for line in got if not line.startswith("after initialize")] == want
    ok = ok and len(memory) == (1 if r == 0 else 0) and all("allocated" in m and "host RSS" in m for m in memory)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (ok, got))
    check(all(o for o, _ in everyone), f"log_dist logs on the ranks asked, see_memory_usage on rank 0 when forced "
          f"({[g for _, g in everyone]})")
    check(deepspeed.comm.get_world_group() is dist.group.WORLD and deepspeed.comm.get_all_ranks_from_group() == [0, 1]
          and deepspeed.comm.log_summary() is None, "deepspeed.comm's get_world_group, get_all_ranks_from_group, "
          "log_summary")
    loader = deepspeed.utils.RepeatingLoader([torch.tensor([i]) for i in range(3)])
    check([int(next(loader)) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0], "RepeatingLoader starts its loader again")


def test_zero_to_fp32():
    # A tied embedding and head: the checkpoint's fp32 state dict holds both
    # names; a plain model loads it and evaluates as the engine does.
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 16)
            self.mix = nn.Linear(16, 16)
            self.head = nn.Linear(16, 32, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, idx):
            return F.cross_entropy(self.head(torch.tanh(self.mix(self.emb(idx)))).reshape(-1, 32),
                                   idx.roll(1, 1).reshape(-1))

    torch.manual_seed(0)
    model = Tied()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(3))
    idx = torch.randint(0, 32, (4, 8), generator=torch.Generator().manual_seed(3))
    for _ in range(3):
        engine.backward(engine(idx))
        engine.step()
    path = os.path.join(TMP, "tied")
    engine.save_checkpoint(path)
    sd = get_fp32_state_dict_from_zero_checkpoint(path)
    check(set(sd) == {"emb.weight", "mix.weight", "mix.bias", "head.weight"},
          f"zero_to_fp32: every name, the tied head's too ({sorted(sd)})")
    live = engine.consolidated_fp32_state_dict()
    check(all(torch.equal(sd[k], live[k]) for k in live), "the checkpoint's fp32 weights are the engine's")
    plain = Tied()
    plain.load_state_dict(sd)
    engine.eval()
    with torch.no_grad():
        a, b = engine(idx).item(), plain(idx).item()
    engine.train()
    check(abs(a - b) <= 1e-6 * abs(b), f"a plain model loaded from it evaluates as the engine ({a:.6f} vs {b:.6f})")
    if dist.get_rank() == 0:  # DeepSpeed's docs: `python zero_to_fp32.py . OUT` in the checkpoint directory
        import subprocess
        out = os.path.join(TMP, "tied-fp32")
        run = subprocess.run([sys.executable, "zero_to_fp32.py", ".", out], cwd=path, capture_output=True, text=True)
        script = torch.load(os.path.join(out, "pytorch_model.bin")) if run.returncode == 0 else {}
        check(set(script) == set(sd) and all(torch.equal(script[k], sd[k]) for k in sd),
              f"the zero_to_fp32.py save_checkpoint writes beside the checkpoints consolidates them "
              f"({run.returncode}: {run.stderr[-300:]})")
    engine.save_16bit_model(os.path.join(TMP, "sixteen"))
    if dist.get_rank() == 0:
        saved = torch.load(os.path.join(TMP, "sixteen", "pytorch_model.bin"))
        check(set(saved) >= {"emb.weight", "mix.weight"}, "save_16bit_model writes the whole model (rank 0)")
    dist.barrier()


def test_weights_only_load_and_16bit_model():
    # load_checkpoint(load_module_only=True): the weights come back, the
    # step count and optimizer state stay this engine's.
    engine = make(2)
    train(engine, 2)
    path = os.path.join(TMP, "weights_only")
    engine.save_checkpoint(path, tag="two")
    saved = engine.consolidated_fp32_state_dict()
    train(engine, 2, first=2)
    load_path, client = engine.load_checkpoint(path, tag="two", load_module_only=True)
    now = engine.consolidated_fp32_state_dict()
    check(load_path is not None and all(torch.equal(saved[k], now[k]) for k in saved),
          "load_checkpoint(load_module_only=True) restores the weights")
    check(engine.global_steps == 4, f"and leaves the step count ({engine.global_steps})")
    # load_optimizer_states=False: the weights, the step count, the LR
    # scheduler's position and the client state, as DeepSpeed's; the param
    # groups' lr is the optimizer's state, so it stays the fresh engine's
    # until the next step (DeepSpeed 0.19.8 reports [0.0] here too).
    torch.manual_seed(0)
    model = Mlp()
    cfg = config(2)
    cfg["scheduler"] = {"type": "WarmupLR", "params": {"warmup_max_lr": 1e-2, "warmup_num_steps": 10}}
    e, _, _, sched = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    train(e, 3)
    e.save_checkpoint(path, tag="warm", client_state={"epoch": 7})
    want_lr, want_iter = e.get_lr(), sched.last_batch_iteration
    torch.manual_seed(0)
    model = Mlp()
    fresh, _, _, fresh_sched = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    fresh_lr = fresh.get_lr()
    _, client = fresh.load_checkpoint(path, tag="warm", load_optimizer_states=False)
    check(client == {"epoch": 7} and fresh.global_steps == 3 and fresh_sched.last_batch_iteration == want_iter
          and fresh.get_lr() == fresh_lr,
          f"load_optimizer_states=False: client state {client}, step {fresh.global_steps}, scheduler at "
          f"{fresh_sched.last_batch_iteration}, lr {fresh.get_lr()} (saved: step 3, {want_iter}, {want_lr})")
    # The getting-started tutorial's tag, the rank's own loss: one checkpoint under rank 0's, with a
    # warning (DeepSpeed's tag_validation default), or an error on every rank with "Fail".
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.save_checkpoint(path, tag=f"loss{dist.get_rank()}")
    check(os.path.isfile(os.path.join(path, "loss0", "manifest.json")) and not os.path.exists(
          os.path.join(path, "loss1")) and any("differs between ranks" in str(w.message) for w in caught),
          "a tag that differs by rank: one checkpoint under rank 0's, and a warning")
    strict = config(2)
    strict["checkpoint"] = {"tag_validation": "Fail"}
    torch.manual_seed(0)
    model = Mlp()
    e, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=strict)
    ok, said = raises(lambda: e.save_checkpoint(path, tag=f"loss{dist.get_rank()}"), ValueError, "differs between")
    check(ok, f"with tag_validation Fail, an error on every rank ({said})")
    # Without a grad norm (compute_grad_norm false, no clipping) the saved norm is NaN: it loads back as none.
    cfg = config(1, compute_grad_norm=False)
    cfg["gradient_clipping"] = 0.0
    runs = []
    for _ in range(2):
        torch.manual_seed(0)
        model = Mlp()
        runs.append(deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)[0])
    train(runs[0], 1)
    runs[0].save_checkpoint(path, tag="no_norm")
    ok, msg = raises(lambda: runs[1].load_checkpoint(path, tag="no_norm"), Exception, "")
    check(not ok and msg == "did not raise" and runs[1].get_global_grad_norm() is None and runs[1].global_steps == 1,
          f"a checkpoint saved with no grad norm computed loads, its norm none ({msg})")
    missing = engine.load_checkpoint(os.path.join(TMP, "nowhere"))
    check(missing == (None, None), "a directory without a checkpoint gives (None, None), as DeepSpeed")
    # A model loaded in bf16 (a checkpoint's torch_dtype) under a bf16 config
    # trains as the same model loaded in fp32.
    torch.manual_seed(0)
    half = Mlp().to(torch.bfloat16)
    torch.manual_seed(0)
    full = Mlp()
    with torch.no_grad():
        for a, b in zip(half.parameters(), full.parameters()):
            b.copy_(a.float())
    cfg = config(2)
    cfg["bf16"] = {"enabled": True}
    runs = []
    for model in (half, full):
        e, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        runs.append(train(e, 3))
    check(runs[0] == runs[1], f"a bf16-loaded model trains as its fp32 twin ({runs[0][-1]:.6f} vs {runs[1][-1]:.6f})")
    # DeepSpeed 0.19.8 casts params, not buffers, to bf16 (a rotary table stays fp32) unless
    # data_types.buffer_dtype says so; integer buffers keep theirs either way.
    for buffer_dtype, want in ((None, torch.float32), ("bf16", torch.bfloat16)):
        torch.manual_seed(0)
        model = Mlp()
        model.register_buffer("table", torch.linspace(0.3, 0.7, 8))
        model.register_buffer("count", torch.zeros(1, dtype=torch.int64))
        cfg = config(2)
        cfg["bf16"] = {"enabled": True}
        if buffer_dtype is not None:
            cfg["data_types"] = {"buffer_dtype": buffer_dtype}
        e, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        check(model.table.dtype == want and model.count.dtype == torch.int64 and
              model.inp.weight.dtype == torch.bfloat16,
              f"bf16 with data_types.buffer_dtype {buffer_dtype}: a float buffer in {model.table.dtype} "
              f"(DeepSpeed's: {want}), params in bf16")
    # A BatchNorm model under bf16 on the CPU: its fp32 statistics would meet bf16 weights in torch's
    # batch_norm; the warning names the key that casts them, and with it the model trains.
    for buffer_dtype in (None, "bf16"):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
        cfg = config(2)
        cfg["bf16"] = {"enabled": True}
        if buffer_dtype is not None:
            cfg["data_types"] = {"buffer_dtype": buffer_dtype}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            e, _, _, _ = deepspeed.initialize(model=net, model_parameters=net.parameters(), config=cfg)
        warned = any("buffer_dtype" in str(w.message) for w in caught)
        check(warned == (buffer_dtype is None), f"BatchNorm under bf16, buffer_dtype {buffer_dtype}: "
              f"{'a warning naming data_types.buffer_dtype' if buffer_dtype is None else 'no warning'}")
        if buffer_dtype is not None:
            x, y = data(0, e)
            e.backward(F.mse_loss(e(x.to(torch.bfloat16)).float(), y))
            e.step()
    # Hugging Face's Trainer and accelerate save a stage-3 model through
    # _zero3_consolidated_16bit_state_dict(): rank 0's whole model in bf16.
    cfg3 = config(3)
    cfg3["bf16"] = {"enabled": True}
    cfg3["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    class MlpWithTable(Mlp):  # a float buffer (a rotary-style table): DeepSpeed keeps its dtype in the save
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.linspace(0, 1, 16))

    torch.manual_seed(0)
    model = MlpWithTable()
    e, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg3)
    train(e, 2)
    sd16 = e._zero3_consolidated_16bit_state_dict()
    fp32 = e.consolidated_fp32_state_dict()
    params = {n for n, _ in model.named_parameters()}
    check(e.zero_gather_16bit_weights_on_model_save() and
          ((sd16 is None) if dist.get_rank() else
           (list(sd16) == list(fp32) and all(torch.equal(sd16[k], fp32[k].to(torch.bfloat16)) for k in params) and
            all(sd16[k].dtype == torch.bfloat16 for k in params) and sd16["table"].dtype == torch.float32 and
            torch.equal(sd16["table"], torch.linspace(0, 1, 16)))),
          "_zero3_consolidated_16bit_state_dict(): the whole model on rank 0, params in bf16, the float buffer "
          f"in its own dtype ({None if sd16 is None else sd16['table'].dtype}); None elsewhere")
    check(sd16 is None or list(sd16) == list(MlpWithTable().state_dict()),
          f"the consolidated state dicts are in the model's state_dict() order ({list(sd16 or {})[:4]})")
    e.save_16bit_model(os.path.join(TMP, "sixteen_table"))
    if dist.get_rank() == 0:
        saved = torch.load(os.path.join(TMP, "sixteen_table", "pytorch_model.bin"))
        check(saved["table"].dtype == torch.float32 and saved["inp.weight"].dtype == torch.bfloat16,
              f"save_16bit_model: params in bf16, a float buffer in its own dtype ({saved['table'].dtype})")
    ok, msg = raises(lambda: engine._zero3_consolidated_16bit_state_dict(), ValueError, "ZeRO-3")
    check(ok, f"_zero3_consolidated_16bit_state_dict() below stage 3 is an error ({msg})")


def test_group_settings_and_step_flags():
    # A weight-decay schedule written into param_groups is trained with:
    # decay 0.1 zeroed before every step equals a run configured with none.
    runs = []
    for decay, zero_it in ((0.1, True), (0.0, False)):
        torch.manual_seed(0)
        model = Mlp()
        cfg = config(2)
        cfg["optimizer"]["params"]["weight_decay"] = decay
        e, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        for s in range(3):
            if zero_it:
                for g in opt.param_groups:
                    g["weight_decay"] = 0.0
            loss = e(*data(s, e))
            e.backward(loss)
            e.step()
        runs.append(e.consolidated_fp32_state_dict())
    check(all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0]),
          "a weight decay set in param_groups before a step is the one the step uses")
    opt.param_groups[0]["betas"] = (0.5, 0.9)
    loss = e(*data(9, e))
    e.backward(loss)
    ok, said = raises(e.step, RuntimeError, "betas changed")
    check(ok, f"betas moved by a scheduler are refused by name, not ignored ({said[:90]})")
    # was_step_applied: only after a step at the accumulation boundary.
    torch.manual_seed(0)
    model = Mlp()
    cfg = config(1)
    cfg["gradient_accumulation_steps"] = 2
    e, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    applied = []
    for s in range(4):
        e.backward(e(*data(s, e)))
        e.step()
        applied.append(e.was_step_applied())
    check(applied == [False, True, False, True], f"was_step_applied at each micro-step: {applied}")
    # optimizer.overflow (fp16 loops test it): the last step skipped by an overflow, as skipped_steps counts.
    torch.manual_seed(0)
    model = Mlp()
    cfg = config(2)
    cfg["fp16"] = {"enabled": True, "initial_scale_power": 8}
    e, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    seen = []
    for scale in (1.0, 1e30, 1.0):
        before = e.skipped_steps
        e.backward(e(*data(0, e)) * scale)
        e.step()
        seen.append((opt.overflow, e.skipped_steps - before, e.get_global_grad_norm() == float("inf")))
    check(seen == [(False, 0, False), (True, 1, True), (False, 0, False)],
          f"optimizer.overflow says the step was skipped, and get_global_grad_norm() is inf then, as DeepSpeed's "
          f"({seen})")
    check(e.loss_scale() == 0.0 and e.dynamic_loss_scale() and opt.cur_scale == opt.loss_scale == 256.0,
          f"engine.loss_scale() is the config's (0: dynamic), optimizer.cur_scale the scale now (2^8, kept "
          f"through one overflow by hysteresis 2) "
          f"({e.loss_scale()}, {opt.cur_scale})")


def test_interrupted_forward():
    # A BaseException (KeyboardInterrupt, say) inside a unit's forward skips
    # torch's always-call hooks; the engine still ends the unit's forward, so
    # training goes on exactly as a run that skipped that batch.
    class Interrupt(BaseException):
        pass

    class Bomb(nn.Module):  # a unit (a param of its own) with a unit inside
        def __init__(self):
            super().__init__()
            self.gain = nn.Parameter(torch.ones(8))
            self.lin = nn.Linear(8, 8)
            self.armed = False

        def forward(self, x):
            y = self.lin(x) * self.gain
            if self.armed:
                raise Interrupt()
            return y

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.bomb = Bomb()
            self.out = nn.Linear(8, 1)

        def forward(self, x, y):
            return F.mse_loss(self.out(torch.tanh(self.bomb(x))), y)

    results = []
    for interrupt in (True, False):
        torch.manual_seed(0)
        model = Net()
        e, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(3))
        for s in range(4):
            if s == 1:
                if interrupt:
                    model.bomb.armed = True
                    try:
                        e(*data(s, e))
                    except Interrupt:
                        pass
                    model.bomb.armed = False
                continue
            e.backward(e(*data(s, e)))
            e.step()
        results.append(e.consolidated_fp32_state_dict())
    check(all(torch.equal(results[0][k], results[1][k]) for k in results[0]),
          "a BaseException inside a unit's forward leaves training as if that batch were skipped")


def test_loader_and_contexts():
    class Seq:  # a map-style dataset that is not a torch Dataset (a Hugging Face dataset, a list)
        def __len__(self):
            return 12

        def __getitem__(self, i):
            return torch.tensor([float(i)])

    torch.manual_seed(0)
    model = Mlp()
    e, _, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(1),
                                           training_data=Seq())
    check(loader is not None and len(loader) == 2, "training_data may be any map-style dataset")
    in_order = torch.cat([b.reshape(-1) for b in e.deepspeed_io(Seq(), route="eval")]).tolist()
    r = dist.get_rank()
    check(in_order == [float(i) for i in range(r, 12, 2)], f"an eval loader keeps the order: {in_order}")
    # GatheredParameters without modifier_rank before initialize: changes are dropped.
    with deepspeed.zero.Init(config_dict_or_path=config(3)) as outer:
        with deepspeed.zero.Init(config_dict_or_path=config(3)):
            torch.manual_seed(0)
            model = Mlp()
        e, _, _, _ = deepspeed.initialize(model=Mlp(), config=config(3))  # initialize inside two contexts
    check("__init_subclass__" not in torch.nn.Module.__dict__, "nested zero.Init contexts leave nn.Module as found")
    with deepspeed.zero.GatheredParameters(model.out.weight):
        before = model.out.weight.detach().clone()
        with torch.no_grad():
            model.out.weight.fill_(float(dist.get_rank() + 1))
    e = make(3, model)
    after = e.consolidated_fp32_state_dict()["out.weight"]
    check(torch.equal(after, before), "GatheredParameters without modifier_rank drops the block's changes")


def test_errors():
    torch.manual_seed(0)
    model = Mlp()
    ok, said = raises(lambda: deepspeed.initialize(model=model, optimizer=torch.optim.RMSprop(model.parameters()),
                                                   config={"train_micro_batch_size_per_gpu": 4}),
                      deepspeed.DeepSpeedConfigError, "RMSprop")
    check(ok, f"an optimizer with no fused update is named ({said})")
    ok, said = raises(lambda: deepspeed.initialize(model=model, model_parameters=list(model.hidden.parameters()),
                                                   config=config(2)),
                      deepspeed.DeepSpeedConfigError, "inp.weight")
    check(ok, f"trainable params left out of model_parameters are named ({said})")
    if dist.get_rank() == 0:  # a released param's memory read from Python: the message names the Python API
        import subprocess
        script = ("import torch, torch.nn as nn, zero_cpp as ds\n"
                  "m = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))\n"
                  "cfg = {'train_micro_batch_size_per_gpu': 2, 'optimizer': {'type': 'SGD', 'params': {'lr': 0.1}}, "
                  "'zero_optimization': {'stage': 3, "
                  "'stage3_param_persistence_threshold': 0}}\n"
                  "e, *_ = ds.initialize(model=m, model_parameters=m.parameters(), config=cfg)\n"
                  "e.backward(e(torch.ones(2, 8)).sum()); e.step()\n"
                  "with ds.zero.GatheredParameters([m[0].weight]):\n"
                  "    view = m[0].weight.data\n"
                  "print(float(view.sum()))\n")
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                                                "MASTER_ADDR", "MASTER_PORT")}
        run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        check(run.returncode != 0 and "'0.weight'" in run.stderr and "deepspeed.zero.GatheredParameters" in run.stderr
              and "consolidated_fp32_state_dict" in run.stderr,
              f"a view kept past GatheredParameters, read after it, stops the process naming the param and the "
              f"Python API to use "
              f"({run.returncode}: {run.stderr.strip()[-400:]})")
    # DeepSpeed's layout but not a checkpoint it could have written: the conversion (rank 0's) fails on
    # every rank, naming it. (Real ones convert and load: ctest python_deepspeed_checkpoint.)
    ds_dir = os.path.join(TMP, "deepspeed-ckpt")
    if dist.get_rank() == 0:
        os.makedirs(os.path.join(ds_dir, "global_step6"), exist_ok=True)
        with open(os.path.join(ds_dir, "latest"), "w") as f:
            f.write("global_step6")
        torch.save({"module": {}}, os.path.join(ds_dir, "global_step6", "mp_rank_00_model_states.pt"))
    dist.barrier()
    engine = make(1)
    ok, said = raises(lambda: engine.load_checkpoint(ds_dir), Exception, "global_step6")
    check(ok, f"a broken DeepSpeed checkpoint is an error on every rank, naming it ({said})")
    bad = config(2)
    bad["zero_optimization"]["stage3_prefetch_bucket_sizes"] = 5
    ok, said = raises(lambda: deepspeed.initialize(model=model, model_parameters=model.parameters(), config=bad),
                      deepspeed.DeepSpeedConfigError, "stage3_prefetch_bucket_sizes")
    check(ok, f"an unknown ds_config key is named ({said})")
    ok, said = raises(lambda: deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(2),
                                                   mpu=object()), NotImplementedError, "mpu")
    check(ok, f"model parallelism (mpu) is refused by name ({said})")
    engine = make(2)
    loss = engine(*data(0, engine))
    ok, said = raises(lambda: engine.backward(loss, retain_graph=True), NotImplementedError, "retain_graph")
    check(ok, f"backward(retain_graph=True) is refused by name ({said})")
    engine.backward(loss)
    engine.step()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        groups_only = engine.optimizer.state_dict()
    check(set(groups_only) == {"param_groups"} and any("save_checkpoint" in str(w.message) for w in said),
          f"optimizer.state_dict() holds the groups' settings only, and warns that the moments are saved by "
          f"engine.save_checkpoint ({[str(w.message)[:80] for w in said]})")
    ok, said = raises(lambda: engine.no_sync().__enter__(), RuntimeError, "stages 0 and 1")
    ok2, _ = raises(lambda: engine.no_sync().__enter__(), AssertionError, "stage 2")
    check(ok and ok2, f"no_sync at stage 2 names the stages it is for, an AssertionError as DeepSpeed's ({said})")
    p = next(engine.module.parameters())
    ok, said = raises(lambda: deepspeed.utils.safe_get_local_grad(p), AssertionError, "ZeRO-3")
    check(ok, f"DeepSpeed's local accessors below stage 3 fail as DeepSpeed's do ({said[:90]})")
    accumulating = config(2)
    accumulating["gradient_accumulation_steps"] = 2
    torch.manual_seed(0)
    model = Mlp()
    e, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=accumulating)
    e.backward(e(*data(0, e)))  # the first of 2 micro-steps: nothing reduced yet
    ok, said = raises(lambda: deepspeed.utils.safe_get_full_grad(next(model.parameters())), RuntimeError,
                      "between a boundary's backward and its step")
    check(ok, f"safe_get_full_grad off the accumulation boundary is an error, not stale grads ({said[:120]})")
    e.step()
    ok, said = raises(lambda: deepspeed.utils.safe_get_full_optimizer_state(p, "momentum_buffer"), ValueError,
                      "exp_avg")
    check(ok, f"an optimizer state the engine does not keep is named, with the ones it does ({said[:120]})")
    ok, said = raises(lambda: deepspeed.utils.safe_set_full_fp32_param(p, torch.zeros(3)), ValueError, "elements")
    check(ok, f"a setter's value of another size is named ({said[:120]})")


def test_checkpoint_without_frozen_params():
    # A fine-tuned adapter over a frozen base (PEFT's LoRA under Hugging Face's
    # Trainer): saved with exclude_frozen_parameters, loaded non-strict into
    # a model whose frozen base is its own.
    class Adapted(nn.Module):
        def __init__(self):
            super().__init__()
            self.base = nn.Linear(8, 16)
            self.base.requires_grad_(False)
            self.adapter = nn.Linear(16, 1)

        def forward(self, x, y):
            return F.mse_loss(self.adapter(torch.tanh(self.base(x))), y)

    for stage in (1, 3):
        torch.manual_seed(0)
        model = Adapted()
        e, _, _, _ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()
                                                                         if p.requires_grad], config=config(stage))
        train(e, 2)
        path = os.path.join(TMP, f"adapter-{stage}")
        e.save_checkpoint(path, exclude_frozen_parameters=True)
        saved = e.consolidated_fp32_state_dict()
        on_disk = get_fp32_state_dict_from_zero_checkpoint(path)
        check(set(on_disk) == {"adapter.weight", "adapter.bias"},
              f"stage {stage}: exclude_frozen_parameters leaves the frozen base out ({sorted(on_disk)})")
        torch.manual_seed(1)  # another adapter, and another base that must stay
        fresh_model = Adapted()
        base = fresh_model.base.weight.detach().clone()
        fresh, _, _, _ = deepspeed.initialize(model=fresh_model, model_parameters=[
            p for p in fresh_model.parameters() if p.requires_grad], config=config(stage))
        ok, said = raises(lambda: fresh.load_checkpoint(path), RuntimeError, "load_module_strict=False")
        check(ok and "base.weight" in said, f"stage {stage}: a strict load names the frozen param missing and "
              f"load_module_strict ({said[:160]})")
        fresh.load_checkpoint(path, load_module_strict=False)
        got = fresh.consolidated_fp32_state_dict()
        check(torch.equal(got["adapter.weight"], saved["adapter.weight"]) and torch.equal(got["base.weight"], base),
              f"stage {stage}: loaded non-strict, the adapter is the saved one and the frozen base the model's own")


def test_non_strict_load_of_another_model():
    # load_module_strict=False into a model with a param the checkpoint lacks
    # (a head added for fine-tuning): the params both have are loaded, the
    # new one keeps its value; strict, it is named.
    class MlpPlus(Mlp):
        def __init__(self):
            super().__init__()
            self.extra = nn.Parameter(torch.full((3,), 0.5))

    for stage in (2, 3):
        e = make(stage)
        train(e, 2)
        path = os.path.join(TMP, f"non-strict-{stage}")
        e.save_checkpoint(path)
        saved = e.consolidated_fp32_state_dict()
        torch.manual_seed(5)
        other = make(stage, MlpPlus())
        ok, said = raises(lambda: other.load_checkpoint(path, load_module_only=True), RuntimeError, "extra")
        check(ok, f"stage {stage}: a strict load names the param the checkpoint lacks ({said[:120]})")
        other.load_checkpoint(path, load_module_strict=False, load_module_only=True)
        got = other.consolidated_fp32_state_dict()
        check(all(torch.equal(got[k], saved[k]) for k in saved) and torch.equal(got["extra"], torch.full((3,), 0.5)),
              f"stage {stage}: loaded non-strict, the params both have are the saved ones, the new one its own")
        train(other, 1)


def test_state_setters():
    # DeepSpeed's setters against the getters, at each stage (their effect on
    # training is held to DeepSpeed's own in python_parity's "surgery").
    utils = deepspeed.utils
    for stage in (0, 1, 2, 3):
        torch.manual_seed(0)
        model = Mlp()
        e, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(stage))
        train(e, 1)
        w = model.hidden[0].weight
        before = utils.safe_get_full_fp32_param(w)
        new = torch.full(tuple(before.shape), 0.25)
        utils.safe_set_full_fp32_param(w, new)
        with deepspeed.zero.GatheredParameters([w]):
            in_module = w.detach().clone()
        check(torch.equal(utils.safe_get_full_fp32_param(w), new) and torch.equal(in_module, before),
              f"stage {stage}: a master set reads back at once; the param keeps its value until the step, as "
              f"DeepSpeed's")
        utils.safe_set_full_optimizer_state(w, torch.ones(tuple(before.shape)), "exp_avg_sq")
        check(torch.equal(utils.safe_get_full_optimizer_state(w, "exp_avg_sq"), torch.ones(tuple(before.shape))),
              f"stage {stage}: an optimizer state set reads back")
        if stage == 3:
            parts = [p.ds_tensor.numel() for p in model.parameters()]
            totals = torch.tensor(parts, dtype=torch.float64)
            dist.all_reduce(totals)
            check(totals.tolist() == [float(p.ds_numel) for p in model.parameters()],
                  "stage 3: each param's ds_tensor parts over the ranks add up to it")
            local = utils.safe_get_local_fp32_param(w)
            utils.safe_set_local_fp32_param(w, local + 1.0)
            mine = utils.safe_get_local_fp32_param(w)
            check(mine.numel() == w.ds_tensor.numel() and torch.equal(mine, local + 1.0),
                  f"stage 3: this rank's part set and read back ({mine.numel()} elements)")
            ok, said = raises(lambda: utils.safe_set_local_fp32_param(w, torch.zeros(w.ds_tensor.numel() + 1)),
                              ValueError, "this rank holds")
            check(ok, f"stage 3: a local value of another size is named ({said[:120]})")
        expected = utils.safe_get_full_fp32_param(w)
        path = os.path.join(TMP, f"setters-{stage}")
        e.save_checkpoint(path)
        with deepspeed.zero.GatheredParameters([w]):
            saved_in_module = w.detach().clone()
        check(torch.equal(saved_in_module, expected),
              f"stage {stage}: save_checkpoint takes the masters set (the params follow)")
        x, y = data(5, e)
        e.backward(e(x, y))
        utils.safe_set_full_grad(w, torch.zeros(tuple(before.shape)))
        check(float(utils.safe_get_full_grad(w).abs().sum()) == 0.0, f"stage {stage}: a grad set reads back")
        e.step()


def test_divergent_unit_order():
    # Ranks that call modules in different orders at stage 3 get the engine's
    # error, on every rank, within seconds -- not a hang.
    class Swapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(8, 8)
            self.b = nn.Linear(8, 8)

        def forward(self, x):
            first, second = (self.a, self.b) if dist.get_rank() == 0 else (self.b, self.a)
            return second(first(x)).pow(2).mean()

    torch.manual_seed(0)
    model = Swapped()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config(3))
    t0 = time.time()
    ok, said = raises(lambda: engine.backward(engine(torch.randn(4, 8))), RuntimeError, "different orders")
    check(ok and time.time() - t0 < 30, f"modules run in different orders by the ranks: named on every rank in "
          f"{time.time() - t0:.1f} s ({said[:120]})")


def test_stage3_module_state_dict_at_rest():
    # A script's `torch.save(model.state_dict(), ...)` at stage 3, outside
    # GatheredParameters, as many tutorials write it: DeepSpeed's holds an
    # empty tensor for each sharded param (and the process goes on); inside
    # the block, the full values. A load at rest is refused before any write,
    # naming the way to do it; inside GatheredParameters(modifier_rank=0) it
    # reaches the engine.
    engine = make(3, stage3_param_persistence_threshold=100)  # `out` (65 params) stays whole
    train(engine, 1)
    model = engine.module
    whole = engine.consolidated_fp32_state_dict()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        sd = model.state_dict()
        path = os.path.join(TMP, f"sd_{dist.get_rank()}.pt")
        torch.save(sd, path)
    back = torch.load(path)
    persistent = {"out.weight", "out.bias"}
    check(set(back) == set(whole) and
          all(back[n].shape == (0,) and back[n].dtype == whole[n].dtype for n in whole if n not in persistent) and
          all(torch.equal(back[n], whole[n]) for n in persistent),
          f"stage 3: module.state_dict() at rest holds DeepSpeed's empty tensors for the sharded params, the "
          f"persistent ones whole, and torch.save writes it ({ {n: tuple(t.shape) for n, t in back.items()} })")
    check(any("consolidated_fp32_state_dict" in str(w.message) and "GatheredParameters" in str(w.message)
              for w in said), f"...with a warning naming the ways to the full values ({[str(w.message) for w in said]})")
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        inside = {n: t.clone() for n, t in model.state_dict().items()}
    check(all(torch.equal(inside[n], whole[n]) for n in whole),
          "stage 3: module.state_dict() inside GatheredParameters holds the full values")

    changed = {n: t * 0.5 for n, t in whole.items()}
    ok, why = raises(lambda: model.load_state_dict(changed), RuntimeError, "GatheredParameters")
    check(ok and "inp.weight" in why and torch.equal(engine.consolidated_fp32_state_dict()["inp.weight"], whole["inp.weight"])
          and all(torch.equal(t, whole[n]) for n, t in engine.consolidated_fp32_state_dict().items()),
          f"stage 3: module.load_state_dict at rest is refused before any write, naming the param and "
          f"GatheredParameters ({why[:160]})")
    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
        if dist.get_rank() == 0:
            model.load_state_dict(changed)
    after = engine.consolidated_fp32_state_dict()
    check(all(torch.equal(after[n], changed[n]) for n in changed),
          "stage 3: module.load_state_dict inside GatheredParameters(modifier_rank=0) reaches the engine")
    loss = train(engine, 1, first=1)[0]
    check(math.isfinite(loss), f"training goes on after ({loss})")

    with deepspeed.zero.Init(config_dict_or_path=config(3)):
        torch.manual_seed(0)
        built = Mlp()
    shapes = {n: tuple(t.shape) for n, t in built.state_dict().items()}
    check(all(s == (0,) for s in shapes.values()), f"zero.Init's model before initialize: state_dict() as "
          f"DeepSpeed's, empty tensors ({shapes})")


def test_manual_backward_with_scale():
    """DeepSpeed's manual backward, engine.scale(loss).backward(): with fp16
    (stages 1 and 3, two micro-batches a step) the losses are those of
    engine.backward(loss), bit for bit; a plain loss.backward() without it
    is refused naming engine.scale. Without fp16 scale() gives the loss
    back, and the run is again engine.backward's."""
    def run(stage, precision, manual, steps=3, gas=2):
        torch.manual_seed(0)
        model = Mlp()
        cfg = dict(config(stage), gradient_accumulation_steps=gas)
        cfg[precision] = {"enabled": True, "initial_scale_power": 8} if precision == "fp16" else {"enabled": True}
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        out = []
        for s in range(steps * gas):
            loss = engine(*data(s, engine))
            if manual:
                engine.scale(loss).backward()
            else:
                engine.backward(loss)
            engine.step()
            out.append(loss.item())
        return out, engine

    for stage, precision in ((1, "fp16"), (3, "fp16"), (2, "bf16")):
        want, _ = run(stage, precision, manual=False)
        got, engine = run(stage, precision, manual=True)
        check(got == want, f"stage {stage} {precision}: engine.scale(loss).backward() trains as engine.backward(loss) "
              f"({got} vs {want})")
    _, engine = run(1, "fp16", manual=False, steps=1, gas=1)
    ok, msg = raises(lambda: engine(*data(0, engine)).backward(), RuntimeError, "engine.scale(loss).backward()")
    check(ok, f"with fp16 a plain loss.backward() without engine.scale is refused, naming it ({msg})")


def test_offload_states():
    """DeepSpeed's offload_states / reload_states (zero3.rst's "Offload
    States") at stages 0 and 3 (python_parity holds stages 1-2 to
    DeepSpeed's): training between them fails on every rank naming
    reload_states -- on the CPU too, where nothing moves, as on a GPU --;
    reloaded, the run goes on as one that never offloaded. DeepSpeed's
    errors for an NVMe target and for offloaded params."""
    from zero_cpp.runtime.zero.offload_config import OffloadDeviceEnum, OffloadStateTypeEnum
    for stage in (0, 3):
        plain = train(make(stage), 4)
        engine = make(stage)
        losses = train(engine, 2)
        engine.offload_states(include=[OffloadStateTypeEnum.optim_states])
        ok, msg = raises(lambda: engine(*data(2, engine)), RuntimeError, "reload_states()")
        check(ok and "optim_states" in msg, f"stage {stage}: a forward with states offloaded names them and "
              f"reload_states() ({msg})")
        ok, msg = raises(lambda: engine.save_checkpoint(os.path.join(TMP, "offloaded")), RuntimeError,
                         "reload_states()")
        check(ok, f"stage {stage}: so does a save ({msg})")
        engine.offload_states(include=["lp_params"], pin_memory=False)
        engine.reload_states()
        losses += train(engine, 2, first=2)
        check(losses == plain, f"stage {stage}: offloaded and reloaded, the losses are those of a run that never "
              f"offloaded ({losses} vs {plain})")
        ok, msg = raises(lambda: engine.offload_states(device=OffloadDeviceEnum.nvme), ValueError, "NVMe")
        check(ok, f"stage {stage}: offload_states to NVMe is DeepSpeed's ValueError ({msg})")
        ok, msg = raises(lambda: engine.offload_states(include=["optimizer"]), ValueError, "optimizer")
        check(ok, f"stage {stage}: an unknown state is named ({msg})")
    engine = make(3, offload_param={"device": "cpu"})
    ok, msg = raises(lambda: engine.offload_states(), AssertionError, "offloaded parameters")
    check(ok, f"offload_states with offload_param is DeepSpeed's AssertionError ({msg})")


class Generator(nn.Module):
    """A model with Hugging Face's `generate` and `reset_cache` (a KV cache)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.head = nn.Linear(8, 16)
        self.resets = 0

    def reset_cache(self):
        self.resets += 1

    def forward(self, input_ids):
        return self.head(self.emb(input_ids))

    def generate(self, input_ids=None, max_new_tokens=2):
        for _ in range(max_new_tokens):
            input_ids = torch.cat([input_ids, self(input_ids)[:, -1:].argmax(-1)], dim=1)
        return input_ids


def test_init_inference():
    """init_inference beyond python_parity's (which holds its dtypes and
    losses to DeepSpeed's): tensor_parallel over both ranks runs the whole
    model on each, its outputs the plain model's; generate() goes to the
    model's, its KV cache reset, a prompt past max_out_tokens refused; the
    forwards timed; what cannot run named: int8, DeepSpeed's inference
    checkpoints, Triton, an unknown key, a key given two ways, a policy
    naming no layer, params on the meta device."""
    torch.manual_seed(0)
    plain = Mlp()
    x, y = data(0, make(0))
    with torch.no_grad():
        want = plain(x, y)
    model = Mlp()
    model.load_state_dict(plain.state_dict())
    engine = deepspeed.init_inference(model, dtype=torch.float32, tensor_parallel={"tp_size": 2})
    with torch.no_grad():
        got = engine(x, y)
    check(torch.equal(got, want) and engine._config.tensor_parallel.tp_size == 2,
          f"tensor_parallel tp_size 2: every rank's output is the plain model's ({got.item()} vs {want.item()})")
    check(isinstance(engine, deepspeed.InferenceEngine) and engine.module is model and
          sorted(engine.state_dict()) == sorted("module." + k for k in plain.state_dict()),
          "the engine is a torch module holding the model as `module`")
    engine.profile_model_time()
    with torch.no_grad():
        engine(x, y)
        engine(x, y)
    times = engine.model_times()
    check(len(times) == 2 and all(t > 0 for t in times) and engine.model_times() == [],
          f"profile_model_time: each forward timed, model_times() returns them and starts over ({times})")

    gen = Generator()
    engine = deepspeed.init_inference(gen, config={"dtype": "fp32", "max_tokens": 4})
    ids = torch.tensor([[1, 2, 3]])
    out = engine.generate(input_ids=ids, max_new_tokens=2)
    check(out.shape == (1, 5) and torch.equal(out, gen.generate(input_ids=ids, max_new_tokens=2)) and gen.resets == 1,
          f"generate() is the model's, its cache reset first ({out.tolist()}, {gen.resets} reset)")
    ok, msg = raises(lambda: engine.generate(input_ids=torch.ones(1, 5, dtype=torch.long)), RuntimeError,
                     "max_out_tokens")
    check(ok, f"a prompt longer than max_out_tokens is refused, naming it ({msg})")
    check(not hasattr(deepspeed.init_inference(Mlp(), dtype=torch.float32), "generate"),
          "a model without generate() gives an engine without one")

    def refused(what, kind, text, config=None, **kwargs):
        ok, msg = raises(lambda: deepspeed.init_inference(Mlp(), config=config, **kwargs), kind, text)
        check(ok, f"init_inference with {what} is refused, naming it ({msg})")

    refused("dtype int8", ValueError, "int8", dtype=torch.int8)
    refused("DeepSpeed's inference checkpoint", ValueError, "checkpoint", checkpoint="ckpt.json")
    refused("use_triton", ValueError, "use_triton", use_triton=True)
    refused("an unknown key", ValueError, "'tensor_paralel'", tensor_paralel={"tp_size": 2})
    refused("an unknown key in a block", ValueError, "'tensor_parallel.size'", tensor_parallel={"size": 2})
    refused("a key set two ways", ValueError, "dtype", config={"dtype": "fp16"}, dtype=torch.bfloat16)
    refused("a policy naming no layer", ValueError, "'attn.proj'", injection_policy={Mlp: ("attn.proj",)})
    refused("a config of the wrong type", ValueError, "JSON", config=3)
    refused("a deprecated key beside its replacement", AssertionError, "'mp_size'", mp_size=2,
            tensor_parallel={"tp_size": 2})
    refused("an integer key that is not one", ValueError, "'min_out_tokens'", min_out_tokens="x")
    c = deepspeed.DeepSpeedInferenceConfig(dtype="auto", tp={"tp_size": "2"}, moe_experts=[4], ep_size=2)
    check((c.dtype, c.tensor_parallel.tp_size, c.moe.moe_experts, c.moe.ep_size) == (torch.float16, 2, [4], 2) and
          deepspeed.default_inference_config()["dtype"] == "torch.float16",
          "the inference config as DeepSpeed's reads it: \"auto\" the default, \"2\" an integer, deprecated keys "
          "moved into their blocks, the dtype by name in the defaults")
    with deepspeed.OnDevice(dtype=torch.float16, device="meta"):
        meta = Mlp()
    ok, msg = raises(lambda: deepspeed.init_inference(meta), ValueError, "meta")
    check(ok, f"a model on the meta device is refused, naming it ({msg})")


def test_on_device():
    """deepspeed.OnDevice: the tensors torch's layers make land on the
    device in the dtype (on "meta": no memory); a tensor the call puts
    elsewhere, and tensors made otherwise (randn), keep what they are;
    enabled=False does nothing; the block ends on an exception."""
    with deepspeed.OnDevice(dtype=torch.bfloat16, device="meta"):
        meta = Mlp()
        elsewhere = torch.zeros(2, device="cpu")
        drawn = torch.randn(2)
        counts = torch.ones(3, dtype=torch.long)
    check(all(p.is_meta and p.dtype == torch.bfloat16 for p in meta.parameters()),
          "a model built under OnDevice(bf16, meta) has bf16 params on the meta device")
    check(elsewhere.device.type == "cpu" and elsewhere.dtype == torch.bfloat16 and drawn.dtype == torch.float32
          and not drawn.is_meta and counts.dtype == torch.long and counts.is_meta,
          "a device named by the call is kept (the dtype still applies); randn is untouched; integers keep theirs")
    with deepspeed.OnDevice(dtype=torch.float16, device="meta", enabled=False):
        off = Mlp()
    check(all(not p.is_meta and p.dtype == torch.float32 for p in off.parameters()), "enabled=False does nothing")
    try:
        with deepspeed.OnDevice(dtype=torch.float16):
            raise KeyError("inside")
    except KeyError:
        pass
    check(not torch.empty(1).is_meta and torch.empty(1).dtype == torch.float32,
          "an exception inside the block leaves torch's factories as they were")
    check(deepspeed.utils.OnDevice is deepspeed.OnDevice, "deepspeed.utils.OnDevice is deepspeed.OnDevice")
    twice = deepspeed.OnDevice(dtype=torch.float16, device="meta")
    with twice:
        with twice:
            inner = torch.zeros(1)
        outer = torch.zeros(1)
    after = torch.zeros(1)
    check(inner.is_meta and outer.is_meta and not after.is_meta and after.dtype == torch.float32,
          "one OnDevice entered twice, nested: each exit leaves its own entry")


class TiledMlp(Mlp):
    """Mlp with its hidden layers deepspeed.zero.TiledLinear (3 x 2 tiles),
    their weights copied from `inits`."""

    def __init__(self, inits):
        super().__init__()
        self.hidden = nn.ModuleList(deepspeed.zero.TiledLinear(64, 64, in_splits=2, out_splits=3, init_linear=i)
                                    for i in inits)


def test_tiled_linear():
    """deepspeed.zero.TiledLinear beyond python_parity's (its losses
    DeepSpeed's at stages 0-3): built under zero.Init, the tiles' weights
    written through GatheredParameters(modifier_rank=0), training as the
    same model built plainly; each tile its own stage-3 unit (gathered on
    its own); the math a plain Linear's; TiledLinearReturnBias's (output,
    bias); bad splits named."""
    def inits():
        torch.manual_seed(1)
        return [nn.Linear(64, 64) for _ in range(4)]

    layers = inits()
    torch.manual_seed(0)
    plain = train(make(3, TiledMlp(layers)), 3)
    cfg, layers = config(3), inits()  # the Linears to copy from made outside: inside they would be partitioned
    with deepspeed.zero.Init(config_dict_or_path=cfg):
        torch.manual_seed(0)
        built = TiledMlp(layers)
    engine = make(3, built)
    check(train(engine, 3) == plain, "TiledLinear built under zero.Init trains as the same model built plainly")
    import re
    units = [int(re.search(r"(\d+) units", e.describe()).group(1)) for e in (engine, make(3))]
    check(units == [2 + 4 * 6, 2 + 4], f"each tile is a stage-3 unit of its own: {units[0]} units, the same model "
          f"with whole Linears {units[1]}")

    linear = nn.Linear(10, 7)
    tiled = deepspeed.zero.TiledLinear(10, 7, in_splits=3, out_splits=2, init_linear=linear)
    x = torch.randn(5, 10)
    check(torch.allclose(tiled(x), linear(x), atol=1e-6) and [len(r) for r in tiled.linears] == [3, 3] and
          [tuple(t.weight.shape) for t in tiled.linears[0]] == [(4, 4), (4, 3), (4, 3)] and
          [t.bias is not None for t in tiled.linears[1]] == [False, False, True],
          "a TiledLinear computes its Linear's output; uneven tiles, the first larger; a bias in the last column only")
    parts = deepspeed.zero.TiledLinear(10, 7, in_splits=2, out_splits=2, input_is_already_split=True,
                                       combine_out_splits=False, init_linear=linear)
    outs = parts(list(torch.split(x, [5, 5], dim=-1)))
    check(len(outs) == 2 and torch.allclose(torch.cat(outs, -1), linear(x), atol=1e-6),
          "input_is_already_split and combine_out_splits=False: split in, rows out")

    class BiasLater(nn.Linear):  # Megatron's: the bias returned, added by the caller
        def forward(self, x):
            return F.linear(x, self.weight), self.bias

    returning = deepspeed.zero.TiledLinearReturnBias(10, 7, in_splits=2, out_splits=3, linear_cls=BiasLater,
                                                     init_linear=linear)
    out, bias = returning(x)
    check(torch.allclose(out + bias, linear(x), atol=1e-6) and torch.equal(bias, linear.bias.detach()),
          "TiledLinearReturnBias: the output without the bias, and the bias joined")
    ok, msg = raises(lambda: deepspeed.zero.TiledLinear(4, 4, in_splits=5), RuntimeError, "in_splits")
    check(ok, f"more tiles than features is refused, naming in_splits ({msg})")


class MoeMlp(nn.Module):
    def __init__(self, **moe):
        super().__init__()
        self.inp = nn.Linear(8, 32)
        self.moe = deepspeed.moe.layer.MoE(hidden_size=32, expert=nn.Linear(32, 32), num_experts=4, **moe)
        self.out = nn.Linear(32, 1)

    def forward(self, x, y):
        h, l_aux, counts = self.moe(torch.tanh(self.inp(x)))
        self.counts = counts
        return F.mse_loss(self.out(h), y) + 0.01 * l_aux


def test_moe():
    """deepspeed.moe beyond python_parity's (its losses DeepSpeed's at
    stages 0-2): at stage 3, where DeepSpeed's refuses MoE, each expert is a
    unit and the losses are stage 0's; the config's optimizer over a model
    with experts (no groups given); exp_counts counts every token's k
    routes; expert params marked; ep_size > 1 refused naming it."""
    runs = {}
    for stage in (0, 3):
        torch.manual_seed(0)
        engine = make(stage, MoeMlp(k=2))
        torch.manual_seed(1)
        runs[stage] = train(engine, 3)
    check(runs[3] == runs[0], f"an MoE model at stage 3 trains as at stage 0 ({runs[3]} vs {runs[0]})")
    check(engine.module.counts.sum().item() == 2 * 4, f"exp_counts: each of the 4 tokens' 2 routes counted "
          f"({engine.module.counts.tolist()})")
    from zero_cpp.moe.utils import has_moe_layers, is_moe_param, split_params_into_shared_and_expert_params
    shared, expert = split_params_into_shared_and_expert_params(list(engine.module.parameters()))
    check(has_moe_layers(engine.module) == (True, 4) and len(expert) == 8 and all(is_moe_param(p) for p in expert)
          and not any(is_moe_param(p) for p in shared), "has_moe_layers, and the 4 experts' 8 params are expert params")
    from deepspeed.moe.sharded_moe import TopKGate as DeepSpeedGate  # DeepSpeed 0.19.8's, the oracle
    same = []
    for k, settings in ((1, {}), (2, {}), (3, {}), (1, {"drop_tokens": False}), (2, {"min_capacity": 1})):
        gates = []
        for cls in (deepspeed.moe.sharded_moe.TopKGate, DeepSpeedGate):
            torch.manual_seed(0)
            gate = cls(8, 4, k, **settings)
            torch.manual_seed(5)
            gates.append(gate(torch.randn(10, 8)))
        same.append(all(torch.equal(a, b) for a, b in zip(*gates)))
    check(all(same), f"TopKGate called directly gives DeepSpeed's dense (l_aux, combine_weights, dispatch_mask, "
          f"exp_counts), bit for bit, for k 1-3 ({same})")
    g = deepspeed.utils.groups
    check((g.get_data_parallel_world_size(), g.get_data_parallel_rank(), g._get_expert_data_parallel_world_size("ep_size_1"),
           g._get_expert_parallel_world_size("ep_size_1"), g.get_tensor_model_parallel_world_size()) ==
          (dist.get_world_size(), dist.get_rank(), dist.get_world_size(), 1, 1) and
          g.get_data_parallel_group() is dist.group.WORLD and deepspeed.dist.get_rank() == dist.get_rank(),
          "deepspeed.utils.groups: one data-parallel group of every rank (the experts' too); model, tensor and "
          "expert parallel groups of one")
    ok, msg = raises(lambda: MoeMlp(ep_size=2), NotImplementedError, "ep_size 2")
    check(ok and "expert parallelism" in msg, f"expert parallelism is refused, naming ep_size ({msg})")


def check_process_group_destroyed_at_exit():
    # Registered before init_distributed, so it runs after zero_cpp's own exit
    # handler (atexit is last in, first out). A Gloo group left up at exit
    # can abort the process in torch's teardown ("terminate called without
    # an active exception", pytorch/pytorch#190489): the group zero_cpp set
    # up must be gone by then.
    if dist.is_initialized():
        print(f"FAIL rank {os.environ.get('RANK')}: torch.distributed's group that init_distributed set up "
              "is still up at exit", flush=True)
        os._exit(101)


def main():
    atexit.register(check_process_group_destroyed_at_exit)
    deepspeed.init_distributed()
    torch.set_num_threads(1)
    check(deepspeed.comm.get_world_size() == 2 and dist.is_initialized(), "init_distributed sets up torch.distributed")
    sys.exit(finish((test_zero_init, test_zero_init_of_tied_weights, test_zero_init_of_a_parent_writing_its_children, test_accelerator_logging_and_loaders, test_gathered_parameters, test_gathered_parameters_under_init, test_init_of_children_by_their_parents,
                 test_module_zero_grad_clears_the_engines_grads, test_module_called_directly_at_stage3,
                 test_stage3_params_say_they_are_partitioned, test_released_params_read_as_deepspeeds,
                 test_host_copies_of_gathered_params_outlive_the_block,
                 test_forward_returning_its_own_param,
                 test_z3_leaf_modules,
                 test_dataloader,
                 test_zero_to_fp32, test_weights_only_load_and_16bit_model, test_group_settings_and_step_flags,
                 test_interrupted_forward, test_loader_and_contexts, test_errors, test_state_setters, test_offload_states, test_manual_backward_with_scale,
                 test_init_inference, test_on_device, test_tiled_linear, test_moe,
                 test_checkpoint_without_frozen_params, test_non_strict_load_of_another_model,
                 test_stage3_module_state_dict_at_rest,
                 test_divergent_unit_order)))  # last: it leaves the ranks' collectives apart


if __name__ == "__main__":
    main()
