"""The peers for the benchmark report: the bundled GPT trained with PyTorch's
DistributedDataParallel, PyTorch's FSDP2 (fully_shard per block, then the
root) or DeepSpeed (its ZeRO stages; on the CPU accelerator with Gloo, or
with ZERO_PEER_DEVICE=cuda on GPU LOCAL_RANK with NCCL), from the same
initial weights and the same batches as zero-train (both exported by
bench_export_gpt), with the same AdamW, clipping (1.0), thread count and --
for FSDP2 and DeepSpeed -- the same ds_config zero-train reads. Launch it
like any rank program:

    zero-run -n 2 -- PYTHON bench/peer_gpt.py PEER EXPORT_DIR LAYERS D_MODEL HEADS SEQ STEPS CONFIG OUT.json

PEER is ddp, fsdp2, deepspeed or zero_cpp (zero-cpp's Python front end). Rank 0 writes OUT.json: per-step loss
(global-batch mean), step time, peak RSS, and the model-state bytes this
rank holds (params, grads and optimizer state, counted from the tensors);
the median step time leaves out the first two steps, as zero-train's.

Precision follows the config's "bf16": {"enabled": true}: FSDP2 computes
with bf16 params (MixedPrecisionPolicy, fp32 reduction), DeepSpeed converts
the model to bf16 and keeps an fp32 master, and DDP -- which has no such
mode -- runs its forward under torch.autocast(bf16) with fp32 params, grads
and AdamW state (PyTorch's usual recipe; its activations and memory are
not those of a bf16 model).

Environment: ZERO_PEER_DEVICE (cpu | cuda), ZERO_PEER_DS_ADAM (DeepSpeed's
AdamW: "torch" adds "torch_adam": true to the optimizer's params, i.e.
torch.optim.AdamW as the other peers use, nothing to compile; "fused" or
unset leaves DeepSpeed's default, FusedAdam, a JIT-built op: a C++ one on
the CPU accelerator, a CUDA one -- ninja and nvcc -- on a GPU).
"""
import json
import os
import resource
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def read_safetensors(path):
    """{name: CPU tensor}, views of one buffer the file is read into once (a
    1.2B-param GPT's init is ~5 GB: no second or third copy)."""
    size = os.path.getsize(path)
    blob = bytearray(size)
    with open(path, "rb") as f:
        if f.readinto(blob) != size:
            raise IOError(f"{path}: short read")
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(bytes(blob[8 : 8 + n]))
    kinds = {"F32": torch.float32, "I64": torch.int64}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        dtype = kinds[e["dtype"]]
        count = (end - b) // dtype.itemsize
        t = torch.frombuffer(blob, dtype=dtype, count=count, offset=8 + n + b) if count else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(e["shape"])
    return out


class Block(torch.nn.Module):
    """zero-cpp's models/gpt.cpp block, layer for layer and name for name
    (pre-LN, causal attention, GELU MLP)."""

    def __init__(self, d, n_head):
        super().__init__()
        self.n_head = n_head
        self.ln1 = torch.nn.LayerNorm(d)
        self.attn_qkv = torch.nn.Linear(d, 3 * d)
        self.attn_proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.mlp_fc = torch.nn.Linear(d, 4 * d)
        self.mlp_proj = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        hd = C // self.n_head
        qkv = self.attn_qkv(self.ln1(x)).view(B, T, 3, self.n_head, hd)
        q, k, v = (qkv.select(2, i).transpose(1, 2) for i in range(3))
        # Fused attention, as models/gpt.cpp: flash / memory-efficient kernels
        # on CUDA, a blocked kernel on the CPU; the scores never materialised.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, C)
        h = x + self.attn_proj(y)
        return h + self.mlp_proj(F.gelu(self.mlp_fc(self.ln2(h))))


class GPT(torch.nn.Module):
    def __init__(self, layers, d, n_head, seq, vocab=256):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, d)
        self.wpe = torch.nn.Embedding(seq, d)
        for i in range(layers):
            self.add_module(f"h{i}", Block(d, n_head))  # named as zero-cpp names them
        self.layers = layers
        self.ln_f = torch.nn.LayerNorm(d)

    def forward(self, tokens):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe.weight[:T]
        for i in range(self.layers):
            x = getattr(self, f"h{i}")(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head


def state_bytes(tensors):
    """Bytes of distinct storages among `tensors` (DTensors count their local shard)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None or not torch.is_tensor(t):
            continue
        if hasattr(t, "to_local"):
            t = t.to_local()
        if t.numel() == 0:
            continue
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def optimizer_tensors(opt):
    for st in opt.state.values():
        yield from (v for v in st.values() if torch.is_tensor(v) and v.dim() > 0)


def torch_training(model, forward, lr, wd, autocast=None):
    """A step and a state count for a model trained with torch.optim.AdamW
    (DDP's and FSDP2's loop; `forward` is the wrapped model; `autocast`, a
    device type, runs the forward under torch.autocast(bf16))."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)

    def step(x, y):
        if autocast:
            with torch.autocast(device_type=autocast, dtype=torch.bfloat16):
                logits = forward(x)
        else:
            logits = forward(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad()  # set_to_none, torch 2.x default
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    def held():
        ps = list(model.parameters())
        return state_bytes(ps + [p.grad for p in ps] + list(optimizer_tensors(opt)))

    return step, held, opt


def qualname(obj):
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def build_ddp(model, cfg, lr, wd, device):
    bf16 = cfg.get("bf16", {}).get("enabled", False)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    step, held, opt = torch_training(model, ddp, lr, wd, autocast=device.type if bf16 else None)
    name = f"torch DistributedDataParallel ({dist.get_backend()})"
    precision = "autocast bf16 (fp32 params, grads and AdamW state)" if bf16 else "fp32"
    return step, held, name, {"precision": precision, "optimizer": qualname(opt)}


def build_fsdp2(model, cfg, lr, wd, device):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    bf16 = cfg.get("bf16", {}).get("enabled", False)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for i in range(model.layers):
        fully_shard(getattr(model, f"h{i}"), mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    name = f"torch FSDP2 fully_shard ({dist.get_backend()})" + (", bf16 params" if bf16 else "")
    step, held, opt = torch_training(model, model, lr, wd)
    precision = "bf16 params for compute, fp32 sharded params, grads and AdamW state" if bf16 else "fp32"
    return step, held, name, {"precision": precision, "optimizer": qualname(opt)}


def build_deepspeed(model, cfg, lr, wd, device):
    import deepspeed

    adam = os.environ.get("ZERO_PEER_DS_ADAM", "")
    if adam == "torch":
        cfg["optimizer"]["params"]["torch_adam"] = True
    elif adam not in ("", "fused"):
        raise ValueError(f"ZERO_PEER_DS_ADAM={adam}: torch or fused")
    engine, opt, _, _ = deepspeed.initialize(model=model, config=cfg, model_parameters=model.parameters())

    def step(x, y):
        logits = engine(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        engine.backward(loss)
        engine.step()
        return loss

    def held():
        # Everything the engine and its optimizer hold as tensors: params (or
        # their ZeRO-3 partitions), flat fp32 partitions and their grads, and
        # the inner optimizer's moments. Transient buffers are not counted.
        ts = []
        for p in model.parameters():
            ts += [p, p.grad, getattr(p, "ds_tensor", None)]
        for obj in (opt, getattr(opt, "optimizer", None)):
            if obj is None:
                continue
            for v in vars(obj).values():
                for t in (v if isinstance(v, (list, tuple)) else [v]):
                    if torch.is_tensor(t):
                        ts += [t, t.grad]
        inner = getattr(opt, "optimizer", opt)
        ts += list(optimizer_tensors(inner))
        return state_bytes(ts)

    stage = cfg.get("zero_optimization", {}).get("stage", 0)
    accel = deepspeed.get_accelerator().device_name()
    inner = getattr(opt, "optimizer", opt)
    bf16 = cfg.get("bf16", {}).get("enabled", False)
    extra = {"precision": "bf16 model, fp32 master and AdamW state" if bf16 else "fp32",
             "optimizer": qualname(inner), "wrapper": qualname(opt), "deepspeed": deepspeed.__version__,
             "ds_accelerator": accel, "torch_adam": adam == "torch"}
    return step, held, f"DeepSpeed {deepspeed.__version__} ZeRO stage {stage} ({accel}, {dist.get_backend()})", extra


def build_zero_cpp(model, cfg, lr, wd, device):
    """zero-cpp's Python front end (python/zero_cpp): the DeepSpeed script with
    the one changed import, on the C++ engine; torch.distributed was set up
    first, as a script that calls init_process_group itself does."""
    import zero_cpp

    engine, opt, _, _ = zero_cpp.initialize(model=model, config=cfg, model_parameters=model.parameters())
    hook_times = []

    def step(x, y):
        before = engine.hook_times()
        logits = engine(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        engine.backward(loss)
        engine.step()
        after = engine.hook_times()
        if after is not None:
            hook_times.append({k: after[k] - before[k] for k in after})
        return loss

    def held():
        return sum(engine.state_bytes()[k] for k in ("params", "grads", "master", "optimizer"))

    stage = cfg.get("zero_optimization", {}).get("stage", 0)
    extra = {"precision": "bf16 model, fp32 master and AdamW state" if cfg.get("bf16", {}).get("enabled") else "fp32",
             "optimizer": "zero-cpp fused AdamW", "hook_times_per_step": hook_times}
    return step, held, f"zero_cpp (Python front end) ZeRO stage {stage} ({dist.get_backend()} + zero-cpp's transports)", extra


def process_age_ms():
    """How long this process has run, in ms: from its start as the kernel
    records it (/proc/self/stat's starttime) to now, so the interpreter's
    start and the imports count; zero-train measures itself the same way."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    start_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 (fields[0] is field 3)
    return (time.clock_gettime(time.CLOCK_BOOTTIME) - start_s) * 1000


def main():
    peer, export, layers, d, heads, seq, steps, config, out = sys.argv[1:10]
    layers, d, heads, seq, steps = int(layers), int(d), int(heads), int(seq), int(steps)
    cfg = json.load(open(config))
    opt_params = cfg["optimizer"]["params"]
    lr, wd = float(opt_params["lr"]), float(opt_params.get("weight_decay", 0.01))
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    # ZERO_PEER_DEVICE=cuda (bench/gpu.sh): the model and batches on GPU
    # LOCAL_RANK, NCCL, step times after a device synchronize.
    cuda = os.environ.get("ZERO_PEER_DEVICE", "cpu") == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = "nccl" if cuda else "gloo"
    if peer != "deepspeed":  # DeepSpeed sets up its own process group
        dist.init_process_group(backend)
    else:
        import deepspeed

        deepspeed.init_distributed(dist_backend=backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    ages = {"rendezvous": process_age_ms()}

    # Built on its device (a GPU initializes a 1B-param model in no time, one
    # CPU thread takes seconds), then the exported weights copied in.
    with device:
        model = GPT(layers, d, heads, seq)
    init = read_safetensors(f"{export}/init.safetensors")
    model.load_state_dict(init, strict=True)
    del init
    build = {"ddp": build_ddp, "fsdp2": build_fsdp2, "deepspeed": build_deepspeed, "zero_cpp": build_zero_cpp}[peer]
    step, held, name, extra = build(model, cfg, lr, wd, device)
    tokens = read_safetensors(f"{export}/tokens.safetensors")["tokens"].clone()
    micro = tokens.shape[1] // world

    losses, times = [], []
    ages["ready"] = process_age_ms()
    for s in range(steps):
        t0 = time.perf_counter()
        batch = tokens[s, rank * micro : (rank + 1) * micro].to(device)
        loss = step(batch[:, :-1], batch[:, 1:])
        if cuda:
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1000)
        if s == 0:
            ages["first_step"] = process_age_ms()
        mean = loss.detach().float().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
    steady = sorted(times[min(2, len(times) // 2) :])
    median_ms = steady[len(steady) // 2]
    model_state = held()
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"peer": name, "torch": torch.__version__, "device": str(device),
                       "threads": torch.get_num_threads(), **extra,
                       "losses": losses, "step_ms": times, "median_step_ms": median_ms,
                       "tokens_per_s": tokens.shape[1] * seq / (median_ms / 1000),
                       "model_state_bytes": model_state, "process_age_ms": ages,
                       "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                       "peak_gpu_bytes": torch.cuda.max_memory_allocated(device) if cuda else 0}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
