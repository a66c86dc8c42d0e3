"""DeepSpeed's flops profiler in the Python front end
(zero_cpp.profiling.flops_profiler), one process, against DeepSpeed
0.19.8's own as the oracle, on the same model objects and inputs:

- get_model_profile's (flops, MACs, params), as numbers and as strings,
  and FlopsProfiler's count for every module, for an MLP, a CNN (conv,
  batch/group/instance norm, pooling, upsampling, in eval and in training),
  transformer blocks (nn.MultiheadAttention with and without masks,
  F.scaled_dot_product_attention, attention written out with @ and
  softmax), a model with frozen params, a shared module, recurrent
  modules, ignore_modules, and mode="generate";
- where the counts differ from DeepSpeed's by design (docs/from-deepspeed.md),
  the difference is the one documented, exactly;
- the printed profile (stdout, output_file), an engine's lines, the
  attributes left on the modules, and that nothing stays active after a
  profile (or a forward that raised).

Every check prints "ok" or "FAIL"; the exit status is the number of failures.
"""
import contextlib
import io
import logging
import os
import sys
import tempfile
import traceback
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

import zero_cpp.profiling.flops_profiler as zp
from zero_cpp.profiling.flops_profiler import FlopsProfiler, get_model_profile

try:
    import deepspeed.profiling.flops_profiler as ds  # the oracle (CI installs it)
    from deepspeed.utils import logger as ds_logger
    ds_logger.setLevel(logging.WARNING)
    UPSTREAM_ERROR = None
except Exception as e:  # noqa: BLE001
    UPSTREAM_ERROR = f"{type(e).__name__}: {e}"

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


# ---- models ----
class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, stride=2, bias=False), nn.BatchNorm2d(16, affine=False), nn.SiLU(), nn.AvgPool2d(2),
            nn.GroupNorm(4, 16), nn.LeakyReLU(), nn.ConvTranspose2d(16, 8, 2, stride=2), nn.Upsample(scale_factor=2),
            nn.InstanceNorm2d(8, affine=True), nn.ELU(), nn.PReLU(), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(8, 10), nn.Softmax(-1))

    def forward(self, x):
        return self.head(self.features(x))


class Block(nn.Module):
    """Pre-norm transformer block around nn.MultiheadAttention."""

    def __init__(self, d=16, heads=4, **attention):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True, **attention)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, **attention):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, **attention)[0]
        return x + self.mlp(self.ln2(x))


class SdpaBlock(nn.Module):
    def __init__(self, d=16, heads=4):
        super().__init__()
        self.heads = heads
        self.ln, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(y.transpose(1, 2).reshape(b, t, d))


class WrittenOut(nn.Module):
    """Attention by hand, and the calls DeepSpeed counts by how they are
    written: torch.add/mul/addmm/baddbmm and F.softmax count, the operators,
    Tensor.softmax and torch.relu do not."""

    def __init__(self, d=16):
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.w, self.b = nn.Parameter(torch.randn(d, d)), nn.Parameter(torch.randn(d))

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        a = (q @ k.transpose(-2, -1) / 4).softmax(-1)
        y = torch.add(torch.matmul(a, v), x) * 2
        y = torch.addmm(self.b, y.reshape(-1, y.shape[-1]), self.w).view_as(x)
        y = torch.baddbmm(y, a, v)
        return F.softmax(torch.mul(y, y), -1) + F.relu(y) + torch.relu(y)


class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.body = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 16))
        self.head = nn.Linear(16, 5)
        for p in list(self.embed.parameters()) + list(self.body.parameters()):
            p.requires_grad_(False)

    def forward(self, ids):
        return self.head(self.body(self.embed(ids)).mean(1))


class Shared(nn.Module):
    """One Linear called twice, and a functional in the parent's own forward."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(12, 12)
        self.out = nn.Linear(12, 3)

    def forward(self, x):
        return F.log_softmax(self.out(F.gelu(self.layer(F.relu(self.layer(x))))), -1)


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 6, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(12, 4, bias=False)
        self.cell = nn.RNNCell(4, 5)

    def forward(self, x):
        y = self.gru(self.lstm(x)[0])[0]
        return self.cell(y[:, -1])


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.step = nn.Sequential(nn.Linear(8, 8), nn.ReLU())

    def forward(self, x):
        return self.step(x)

    def generate(self, x, steps=3):
        for _ in range(steps):
            x = self(x)
        return x


def fresh(factory):
    torch.manual_seed(0)
    return factory()


torch.manual_seed(0)
TOKENS = torch.randn(2, 6, 16)
IMAGES = torch.randn(2, 3, 16, 16)
CAUSAL = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1)
PADDING = torch.tensor([[False] * 5 + [True], [False] * 6])

# name: (model factory, args, kwargs)
MODELS = {
    "MLP": (lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4)),
            (torch.randn(4, 16),), {}),
    "CNN": (Cnn, (IMAGES,), {}),
    "transformer block (MultiheadAttention)": (Block, (TOKENS,), {}),
    "transformer block, causal mask": (Block, (TOKENS,), {"attn_mask": CAUSAL}),
    "transformer block, causal and padding masks": (Block, (TOKENS,), {"attn_mask": CAUSAL,
                                                                      "key_padding_mask": PADDING}),
    "transformer block, bias_kv, zero_attn": (lambda: Block(add_bias_kv=True, add_zero_attn=True), (TOKENS,),
                                              {"attn_mask": CAUSAL}),
    "transformer block, need_weights=False": (Block, (TOKENS,), {"need_weights": False}),
    "transformer block (scaled_dot_product_attention)": (SdpaBlock, (TOKENS,), {}),
    "attention written out": (WrittenOut, (TOKENS,), {}),
    "frozen embedding and body": (Frozen, (torch.randint(0, 50, (3, 7)),), {}),
    "shared module": (Shared, (torch.randn(5, 12),), {}),
    "LSTM, GRU, RNNCell": (Recurrent, (torch.randn(3, 5, 8),), {}),
}


def model_profile(lib, factory, args, kwargs, **options):
    return lib.get_model_profile(fresh(factory), args=list(args), kwargs=kwargs, print_profile=False, **options)


def per_module(lib, model, run, ignore=None):
    """Each module's (flops, MACs, params) after one profiled run()."""
    prof = lib.FlopsProfiler(model)
    prof.start_profile(ignore_list=ignore)
    run()
    prof.stop_profile()
    counts = {name or "(model)": (lib.get_module_flops(m), lib.get_module_macs(m), m.__params__)
              for name, m in model.named_modules()}
    prof.end_profile()
    return counts


def differing(expected, got):
    return {name: (expected[name], got.get(name)) for name in expected if expected[name] != got.get(name)}


# ---- checks ----
def test_totals_and_strings():
    for name, (factory, args, kwargs) in MODELS.items():
        expected = model_profile(ds, factory, args, kwargs, as_string=False)
        got = model_profile(zp, factory, args, kwargs, as_string=False)
        check(got == expected and all(isinstance(v, int) for v in got),
              f"{name}: get_model_profile (flops, MACs, params) = DeepSpeed's {expected} (got {got})")
        expected = model_profile(ds, factory, args, kwargs)
        got = model_profile(zp, factory, args, kwargs)
        check(got == expected, f"{name}: as strings, DeepSpeed's {expected} (got {got})")


def test_each_module():
    for name, (factory, args, kwargs) in MODELS.items():
        for training in (False, True):
            model = fresh(factory).train(training)
            expected = per_module(ds, model, lambda: model(*args, **kwargs))
            got = per_module(zp, model, lambda: model(*args, **kwargs))
            check(not differing(expected, got), f"{name} ({'training' if training else 'eval'}): every module's "
                  f"flops, MACs and params as DeepSpeed's; differing: {differing(expected, got)}")


def test_frozen_params_count():
    model = fresh(Frozen)
    frozen = sum(p.numel() for p in model.parameters() if not p.requires_grad)
    _, _, params = get_model_profile(model, args=[torch.randint(0, 50, (3, 7))], print_profile=False,
                                     as_string=False)
    check(frozen > 0 and params == sum(p.numel() for p in model.parameters()),
          f"params count frozen params too, as DeepSpeed 0.19.8's ({params})")


def test_input_shape_and_inputs():
    factory = MODELS["CNN"][0]
    for lib_args in ({"input_shape": (2, 3, 16, 16)},
                     {"input_shape": (2, 3, 16, 16), "args": None, "kwargs": None},  # the tutorial's call
                     {"kwargs": {"x": IMAGES}}):
        expected = ds.get_model_profile(fresh(factory), print_profile=False, **lib_args)
        got = get_model_profile(fresh(factory), print_profile=False, **lib_args)
        check(got == expected, f"get_model_profile({', '.join(lib_args)}): DeepSpeed's {expected} (got {got})")
    model = fresh(factory).double()
    seen = []
    model.register_forward_pre_hook(lambda m, a: seen.append((a[0].dtype, tuple(a[0].shape))))
    get_model_profile(model, input_shape=(1, 3, 16, 16), print_profile=False, warm_up=2)
    check(seen == [(torch.float64, (1, 3, 16, 16))] * 3,
          f"input_shape: one tensor of that shape in the params' dtype, warm_up + 1 forwards ({seen})")
    for bad in ({}, {"input_shape": [2, 3]}):
        try:
            get_model_profile(fresh(factory), print_profile=False, **bad)
            check(False, f"get_model_profile({bad}) raises")
        except ValueError as e:
            check("get_model_profile" in str(e), f"get_model_profile({bad}) raises ValueError: {e}")


def test_generate_mode():
    expected = ds.get_model_profile(fresh(Generator), args=[torch.randn(2, 8)], mode="generate",
                                    print_profile=False, as_string=False)
    got = get_model_profile(fresh(Generator), args=[torch.randn(2, 8)], mode="generate", print_profile=False,
                            as_string=False)
    check(got == expected and got[1] == 3 * 2 * 8 * 8, f"mode='generate' profiles generate(): DeepSpeed's "
          f"{expected} (got {got})")


def test_ignore_modules():
    for name, ignore in (("MLP", [nn.ReLU, nn.Linear]), ("CNN", [nn.Conv2d, nn.BatchNorm2d, nn.Sequential]),
                         ("transformer block (MultiheadAttention)", [nn.MultiheadAttention, nn.LayerNorm]),
                         ("LSTM, GRU, RNNCell", [nn.GRU])):
        factory, args, kwargs = MODELS[name]
        expected = model_profile(ds, factory, args, kwargs, ignore_modules=ignore, as_string=False)
        got = model_profile(zp, factory, args, kwargs, ignore_modules=ignore, as_string=False)
        check(got == expected, f"{name}, ignore_modules={[t.__name__ for t in ignore]}: DeepSpeed's totals "
              f"{expected} (got {got})")
        model = fresh(factory)
        expected = per_module(ds, model, lambda: model(*args, **kwargs), ignore)
        got = per_module(zp, model, lambda: model(*args, **kwargs), ignore)
        ignored_leaves = [n for n, m in model.named_modules() if type(m) in ignore and not list(m.children())]
        check(not differing(expected, got) and ignored_leaves and all(got[n][:2] == (0, 0) for n in ignored_leaves),
              f"{name}: ignored modules count nothing of their own, their work counts to the module around "
              f"them, as DeepSpeed's; differing: {differing(expected, got)}")


def test_documented_differences():
    """Where DeepSpeed's count is not torch's work, the difference is the documented one."""
    x = TOKENS
    layer = fresh(lambda: nn.TransformerEncoderLayer(16, 4, 32, batch_first=True))
    expected = per_module(ds, layer, lambda: layer(x))["(model)"]
    got = per_module(zp, layer, lambda: layer(x))["(model)"]
    relu = x.numel() // 16 * 32
    check(got[1:] == expected[1:] and got[0] - expected[0] == relu,
          f"TransformerEncoderLayer: the activation it holds (F.relu) counted, {relu} flops DeepSpeed's "
          f"patching misses ({expected} vs {got})")

    class Einsum(nn.Module):
        def forward(self, a):
            return torch.einsum("bij,bjk->bik", a, a.transpose(1, 2))

    class Bmm(nn.Module):
        def forward(self, a):
            return torch.bmm(a, a.transpose(1, 2))

    as_einsum = get_model_profile(Einsum(), args=[x], print_profile=False, as_string=False)
    as_bmm = ds.get_model_profile(Bmm(), args=[x], print_profile=False, as_string=False)
    ds_einsum = ds.get_model_profile(Einsum(), args=[x], print_profile=False, as_string=False)
    check(as_einsum == as_bmm and ds_einsum[1] == 0,
          f"einsum counted as the matmul it runs, DeepSpeed's count of torch.bmm {as_bmm} (got {as_einsum}; "
          f"DeepSpeed's einsum: {ds_einsum}, no MACs)")

    block = fresh(Block).eval()
    with torch.no_grad():
        got = per_module(zp, block, lambda: block(x))["(model)"]
        fast = per_module(ds, block, lambda: block(x))["(model)"]
    expected = per_module(ds, block, lambda: block(x))["(model)"]
    check(got == expected and fast[1] < expected[1],
          f"MultiheadAttention under no_grad in eval counted as with grad {expected} (got {got}); DeepSpeed's "
          f"misses its fused fast path ({fast})")


def test_printed_profile():
    factory, args, _ = MODELS["CNN"]
    model = fresh(factory)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        result = get_model_profile(model, args=list(args), module_depth=-1, top_modules=2)
    text = stdout.getvalue()
    flops, macs, params = result
    check(all(s in text for s in ("fwd MACs per GPU:", macs, "params per GPU:", params, "fwd flops per GPU:",
                                  flops, "fwd latency:", "depth 0:", "depth 2:", "(features): Sequential(",
                                  "(0): Conv2d(", "kernel_size=(3, 3)", "% MACs", "FLOPS")),
          "get_model_profile prints the totals, each depth's top modules and the module tree to stdout")
    check("'Sequential'" in text.split("depth 1:")[1].split("depth 2:")[0] and "'Conv2d'" in text.split("depth 2:")[1],
          "the aggregated profile names the module types at each depth")

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "sub", "profile.txt")
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            get_model_profile(fresh(factory), args=list(args), output_file=path, detailed=False, module_depth=1)
        written = open(path).read() if os.path.exists(path) else ""
        check(stdout.getvalue() == "" and "fwd flops per GPU:" in written and "depth 0:" in written
              and "depth 1:" not in written and "(0): Conv2d(" not in written,
              "output_file: the profile goes to the file (its directory made), not stdout; module_depth=1 and "
              "detailed=False trim it")

    model = fresh(factory)
    prof = FlopsProfiler(model)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        prof.print_model_profile()
    check(stdout.getvalue() == "", "print_model_profile before start_profile prints nothing, as DeepSpeed's")


def test_training_workflow_and_engine():
    """The tutorial's loop, and the engine's use: start, forward, stop,
    backward and step, print with the step, end."""
    model = fresh(MODELS["MLP"][0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 16)
    expected = per_module(ds, model, lambda: model(x))["(model)"]

    class Engine:  # only the attributes FlopsProfiler documents, and global_steps
        global_steps = 7
        world_size = dp_world_size = 4
        mp_world_size = 2

        def train_micro_batch_size_per_gpu(self):
            return 3

        def wall_clock_breakdown(self):
            return True

        def timers(self, name):
            return types.SimpleNamespace(elapsed=lambda reset: {"fwd": 2.0, "bwd": 4.0, "step": 1.0}[name])

    for engine in (None, types.SimpleNamespace(global_steps=3), Engine()):
        prof = FlopsProfiler(model, ds_engine=engine, recompute_fwd_factor=1.0)
        prof.start_profile()
        loss = model(x).square().mean()
        check(all(hasattr(m, a) for m in model.modules() for a in ("__flops__", "__macs__", "__params__",
                                                                     "__duration__")),
              "while profiling every module has __flops__, __macs__, __params__, __duration__")
        prof.stop_profile()
        loss.backward()
        opt.step()
        totals = (prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params())
        check(totals == expected and prof.get_total_duration() > 0 and prof.get_total_flops(as_string=True) ==
              ds.number_to_string(expected[0]), f"engine {type(engine).__name__}: totals after backward and step "
              f"are the forward's, DeepSpeed's {expected} (got {totals})")
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            prof.print_model_profile(profile_step=getattr(engine, "global_steps", 1), detailed=False)
        text = stdout.getvalue()
        if isinstance(engine, Engine):
            check(all(s in text for s in ("step 7", "world size:", "model parallel size:", "batch size per GPU:",
                                          "bwd latency:", "4 ms", "3 * fwd flops per GPU", "samples/second:")),
                  "an engine's sizes, batch and (wall_clock_breakdown) timers are printed")
            check("params of model = params per GPU * mp_size:" in text and
                  ds.params_to_string(2 * expected[2]) in text, "the model's params are mp_size times the GPU's")
        else:
            check("fwd flops per GPU:" in text and "world size" not in text,
                  f"engine {type(engine).__name__}: printed without the engine's lines")
        prof.end_profile()
        check(not any(hasattr(m, "__flops__") for m in model.modules()) and not model._forward_hooks
              and not model._forward_pre_hooks, "end_profile removes the attributes and the hooks")

    # Backward while the hooks are still on counts nothing more.
    prof = FlopsProfiler(model)
    prof.start_profile()
    model(x).square().mean().backward()
    got = (prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params())
    prof.end_profile()
    check(got == expected, f"a backward before stop_profile is not counted ({got})")


def test_nothing_left_active():
    class Failing(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            y = self.inner(x)
            if x.shape[0] == 1:
                raise RuntimeError("a forward that fails")
            return y

    model = Failing()
    prof = FlopsProfiler(model)
    prof.start_profile()
    try:
        model(torch.randn(1, 4))
    except RuntimeError:
        pass
    active = torch.overrides.has_torch_function((torch.ones(1),))
    model(torch.randn(2, 4))
    got = prof.get_total_macs()
    prof.end_profile()
    check(not active and got == (1 + 2) * 4 * 4, f"a forward that raised leaves no mode active; what it ran "
          f"and the next forward count ({got} MACs)")
    check(not torch.overrides.has_torch_function((torch.ones(1),)), "no torch-function mode after end_profile")


def test_formatting_helpers():
    numbers = (0, 0.25, 5e-7, 999, 1000, 123456789, 9.87654e12, 3.5e15)
    names = ("number_to_string", "flops_to_string", "macs_to_string", "params_to_string", "duration_to_string",
             "bytes_to_string")
    wrong = [(name, n, units) for name in names for n in numbers for units in (None, "M", "G", "B", "m")
             if getattr(zp, name)(n, units=units) != getattr(ds, name)(n, units=units)]
    check(not wrong, f"the string helpers write DeepSpeed's strings; differing: {wrong[:5]}")
    check(callable(zp.get_module_flops) and callable(zp.get_module_macs) and callable(zp.get_module_duration),
          "get_module_flops, get_module_macs, get_module_duration exported")


def main():
    torch.set_num_threads(1)
    if UPSTREAM_ERROR is not None:
        check(False, f"DeepSpeed (the oracle) imports: {UPSTREAM_ERROR}")
    else:
        for test in (test_totals_and_strings, test_each_module, test_frozen_params_count,
                     test_input_shape_and_inputs, test_generate_mode, test_ignore_modules,
                     test_documented_differences, test_printed_profile, test_training_workflow_and_engine,
                     test_nothing_left_active, test_formatting_helpers):
            try:
                test()
            except Exception:  # noqa: BLE001
                check(False, f"{test.__name__} raised:\n{traceback.format_exc()}")
    print(f"{len(failures)} failure(s)" if failures else "all checks passed", flush=True)
    sys.exit(min(len(failures), 100))


if __name__ == "__main__":
    main()
