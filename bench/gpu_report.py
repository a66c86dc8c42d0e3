"""Turns bench/gpu.sh's JSON into one markdown table (zero-cpp's stages and
the peers) and the seeds' ratios, each measured in that same run beside the
figure its seed document reports. Standard library only.

    python3 bench/gpu_report.py bench/results/gpu.json [OUT.md]

Prints the markdown (and writes it to OUT.md when given).
"""
import json
import statistics
import sys

# What each seed document (shared/seeds/) reports, for comparison. The
# seeds measured other systems on other machines: compare ratios, not times.
SEEDS = {
    "000": ("unfused ÷ fused stage-3 step time (fp32 master gathered then cast, vs 16-bit shards gathered)",
            "1.30× (438 → 337 ms/step; DeepCompile on RTX 5090s; peak 9.5 → 8.5 GB)"),
    "001": ("NCCL ÷ CUDA IPC collective time (IPC's bandwidth ÷ NCCL's)",
            "1.12× and 1.11× end to end (RCCL vs SDMA allgather: 697.7 → 622.0 ms GPT-7B-ish, "
            "1402.5 → 1263.2 ms Qwen3-32B; 8 × MI300X)"),
    "002": ("separate ÷ coalesced step time, 4 backward passes per step, stage 2",
            "1.69× (203 → 120 ms, Z2, 2 GPUs; Z3: 177 → 133 ms, 1.33×)"),
    "003": ("host ÷ device flatten, model build time under zero::Init (stage 3)",
            "2.94× (~382 → ~130 s, Z2 init of 32 Qwen3-30B layers, 8 × H100)"),
}

PEER_NAMES = {"ddp": "DDP", "fsdp2": "FSDP2", "deepspeed": "DeepSpeed", "zero_cpp": "zero_cpp (Python front end)"}
# zero-cpp's stage each peer is set beside.
MATCH = {("ddp", 0): 0, ("fsdp2", 3): 3, ("deepspeed", 0): 0, ("deepspeed", 1): 1, ("deepspeed", 2): 2,
         ("deepspeed", 3): 3, ("zero_cpp", 0): 0, ("zero_cpp", 3): 3}


def gb(b):
    return f"{b / 2**30:.2f} GiB"


def step_ms(r):
    """Median step time of a run: zero-cpp's device-synchronized wall time
    when its summary has one, else its step_ms median; a peer's median."""
    if "summary" in r:
        s = r["summary"]
        return s.get("median_wall_ms") or s["median_step_ms"]
    return r["result"]["median_step_ms"]


def model_arg(run, name):
    words = run["model"].split()
    return int(words[words.index(name) + 1])


def tokens_per_s(r, run):
    tokens = run["micro_batch"] * model_arg(run, "--seq")
    return tokens / (step_ms(r) / 1000)


# Dense bf16 tensor-core peaks (no sparsity), by the device name's model.
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0}


def flops_per_token(run):
    """Training FLOP per token of the bundled GPT, counted as PaLM's MFU
    counts it: 6 per param (forward 2, backward 4) over the blocks' 12·L·d²
    params and the 256-byte vocabulary's head, plus attention's 12·L·d·T
    (the whole T×T scores and their product with V; a causal kernel skips
    about half of that work, which MFU does not credit)."""
    L, d, T = model_arg(run, "--layers"), model_arg(run, "--d-model"), model_arg(run, "--seq")
    return 6 * (12 * L * d * d + 256 * d) + 12 * L * d * T


def mfu(r, run):
    peak = next((p for name, p in PEAK_BF16_TFLOPS.items() if name in run.get("device", "")), None)
    if peak is None or r.get("dtype") != "bf16":
        return ""
    return f"{tokens_per_s(r, run) * flops_per_token(run) / (peak * 1e12):.1%}"


def memory(r):
    res = r.get("summary") or r.get("result")
    if res.get("peak_gpu_bytes"):
        return res["peak_gpu_bytes"], gb(res["peak_gpu_bytes"])
    return res["peak_rss_bytes"], f"RSS {gb(res['peak_rss_bytes'])}"  # a CPU run: no GPU memory


def losses(r):
    return r.get("losses") or r.get("result", {}).get("losses") or []


def max_diff(a, b):
    n = min(len(a), len(b))
    return max(abs(x - y) for x, y in zip(a[:n], b[:n])) if n else None


def label(r):
    offload = f", {r['offload']} offloaded" if r.get("offload") else ""
    if r["run"] == "zero-cpp":
        return f"zero-cpp stage {r['stage']}{offload}"
    name = PEER_NAMES.get(r["run"], r["run"])
    return f"{name} stage {r['stage']}{offload}" if r["run"] in ("deepspeed", "zero_cpp") else name


def ok(r):
    return "error" not in r and "skipped" not in r


# The main table's rows in this order, whatever order the bench ran them in
# (it runs what each goal needs first); others after them.
ROW_ORDER = [("zero-cpp", 0, ""), ("zero-cpp", 1, ""), ("zero-cpp", 2, ""), ("zero-cpp", 3, ""), ("ddp", 0, ""),
             ("fsdp2", 3, ""), ("deepspeed", 0, ""), ("deepspeed", 2, ""), ("deepspeed", 3, ""), ("zero_cpp", 0, ""),
             ("zero_cpp", 3, ""), ("zero-cpp", 2, "optimizer"), ("deepspeed", 2, "optimizer"),
             ("zero-cpp", 3, "param+optimizer"), ("deepspeed", 3, "param+optimizer")]


def row_rank(r):
    key = (r["run"], r.get("stage"), r.get("offload", ""))
    return ROW_ORDER.index(key) if key in ROW_ORDER else len(ROW_ORDER)


def main_table(w, run):
    runs = sorted((r for r in run["runs"] if r["run"] == "zero-cpp" or r["run"] in PEER_NAMES), key=row_rank)
    # zero-cpp's runs by (stage, what is offloaded), each peer's run set beside the same.
    ours = {(r["stage"], r.get("offload", "")): r for r in runs if r["run"] == "zero-cpp" and ok(r)}
    ddp = next((r for r in runs if r["run"] == "ddp" and ok(r)), None)
    w("| run | dtype | step ms | tokens/s | MFU | peak GPU memory | final loss | max \\|Δloss\\| vs zero-cpp same stage "
      "| step ÷ DDP | zero-cpp ÷ this (step, memory) | notes |")
    w("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        if not ok(r):
            why = r.get("error") or r.get("skipped")
            if r.get("last_line"):
                why += f": {r['last_line']}"
            if r.get("log"):
                why += f" (log: {r['log']})"
            state = "failed" if "error" in r else "skipped"
            w(f"| {label(r)} | {r.get('dtype', '')} | {state} | | | | | | | | {why.replace('|', '/')} |")
            continue
        ms = step_ms(r)
        mem_b, mem = memory(r)
        ls = losses(r)
        final = f"{ls[-1]:.4f}" if ls else ""
        vs_ddp = f"{ms / step_ms(ddp):.2f}×" if ddp else ""
        notes = []
        if r["run"] == "zero-cpp":
            diff = ""
            ratio = ""
            if "median_wall_ms" not in r["summary"]:
                notes.append("step_ms (no device sync)")
            t = r.get("times_ms")
            if t:  # wall_clock_breakdown, device-synchronised: where the step's time goes
                notes.append(f"forward {t['forward']:.1f}, backward {t['backward']:.1f} (reduction wait "
                             f"{t['backward_allreduce']:.1f}), step {t['step']:.1f} (all-gather "
                             f"{t['step_allgather']:.1f}) ms")
        else:
            res = r["result"]
            mine = ours.get((MATCH.get((r["run"], r["stage"])), r.get("offload", "")))
            d = max_diff(ls, losses(mine)) if mine else None
            diff = f"{d:.2e}" if d is not None else ""
            ratio = ""
            if mine:
                m_b, _ = memory(mine)
                ratio = f"{step_ms(mine) / ms:.2f}× / {m_b / mem_b:.2f}×" if mem_b else f"{step_ms(mine) / ms:.2f}×"
            notes.append(res.get("precision", ""))
            if r["run"] == "deepspeed":
                notes.append(res.get("optimizer", "").rsplit(".", 1)[-1] + (" (torch_adam)" if res.get("torch_adam") else ""))
            hooks = [h for h in res.get("hook_times_per_step", [])[2:]]
            if hooks:  # the Python front end's stage-3 hooks: their time, and the part in the C++ engine
                total = sorted(h["total_s"] for h in hooks)[len(hooks) // 2] * 1000
                engine = sorted(h["engine_s"] for h in hooks)[len(hooks) // 2] * 1000
                notes.append(f"hooks {total:.1f} ms/step, {engine:.1f} in the engine")
        w(f"| {label(r)} | {r['dtype']} | {ms:.1f} | {tokens_per_s(r, run):,.0f} | {mfu(r, run)} | {mem} | {final} | {diff} | {vs_ddp} "
          f"| {ratio} | {'; '.join(n for n in notes if n)} |")
    w("")


def seed_rows(run):
    by = {}
    for r in run["runs"]:
        if r["run"].startswith("zero-cpp seed "):
            by.setdefault(r["run"][-3:], []).append(r)

    def failed(rs):
        bad = [r for r in rs if not ok(r)]
        if not bad:
            return None
        r = bad[0]
        return ("failed: " + r["error"] + (f" ({r['log']})" if r.get("log") else "")) if "error" in r \
            else "skipped: " + r["skipped"]

    rows = {}
    rs = by.get("000", [])
    if failed(rs) or not rs:
        rows["000"] = ("", failed(rs) or "not run")
    else:
        res = rs[0]["result"]
        runs = res["runs"]
        peak = lambda unfused: statistics.median(x["summary"].get("peak_gpu_bytes", 0) for x in runs
                                                 if x["fp32_master_gather"] == unfused)
        # The medians over its runs, of the device-synchronized step time
        # when the summaries have it (gather_fusion.sh's own ratio uses step_ms).
        ms = lambda unfused: statistics.median(step_ms(x) for x in runs if x["fp32_master_gather"] == unfused)
        note = f"unfused {ms(True):.1f} vs fused {ms(False):.1f} ms, 2 ranks on {res['device']}"
        if peak(False):
            note += f"; peak GPU {gb(peak(True))} vs {gb(peak(False))}"
        rows["000"] = (f"{ms(True) / ms(False):.2f}×", note)

    rs = by.get("001", [])
    if failed(rs) or not rs:
        rows["001"] = ("", (failed(rs) or "not run") + "; NCCL refuses two ranks on one GPU, so on a one-GPU "
                       "machine the ratio is not measurable")
    else:
        ops = ("allgather_gbps", "reduce_scatter_gbps", "all_reduce_gbps")
        short = {"allgather_gbps": "allgather", "reduce_scatter_gbps": "reduce-scatter", "all_reduce_gbps": "all-reduce"}

        def vs_copy(row):
            return ", ".join(f"{short[o]} {row['cuda_ipc_over_d2d_copy'][o]:.2f}" for o in ops)

        # Issue 36 item 2's goal is at >= 64 MiB: the 64 MiB row and the largest, per path.
        notes, res = [], rs[0]["result"]
        for r in rs:
            sizes = sorted(r["result"]["rows"], key=lambda x: x["bytes"])
            at64 = next((x for x in sizes if x["bytes"] >= 64 << 20), sizes[-1])
            big = sizes[-1]
            notes.append(f"{r.get('ipc_path', 'staged')}: {vs_copy(at64)} at {at64['bytes'] / 2**20:.0f} MiB, "
                         f"{vs_copy(big)} at {big['bytes'] / 2**20:.0f} MiB")
        big = max(res["rows"], key=lambda x: x["bytes"])
        if "cuda_ipc_over_nccl" in big:
            ratio = " / ".join(f"{big['cuda_ipc_over_nccl'][o]:.2f}×" for o in ops)
            rows["001"] = (ratio, f"allgather / reduce-scatter / all-reduce at {big['bytes'] / 2**20:.0f} MiB; "
                                  f"CUDA IPC ÷ device copy, " + "; ".join(notes))
        else:
            rows["001"] = ("not measurable", f"{res['gpus']} GPU for {res['ranks']} ranks: NCCL refuses two ranks on "
                           f"one GPU, so only CUDA IPC ran; its bandwidth ÷ the device-to-device copy rate, "
                           + "; ".join(notes))

    rs = by.get("002", [])
    if failed(rs) or len(rs) < 2:
        rows["002"] = ("", failed(rs) or "not run")
    else:
        sep = next(r for r in rs if r["reduction"] == "separate")
        coa = next(r for r in rs if r["reduction"] == "coalesce")
        calls = lambda r: r["summary"]["last_step_comm"].get("reduce_scatter", {}).get("calls", 0)
        rows["002"] = (f"{step_ms(sep) / step_ms(coa):.2f}×",
                       f"separate {step_ms(sep):.1f} vs coalesced {step_ms(coa):.1f} ms, {sep.get('ranks', 1)} ranks; reduce-scatter "
                       f"calls per step {calls(sep)} → {calls(coa)}")

    rs = by.get("003", [])
    if failed(rs) or len(rs) < 2:
        rows["003"] = ("", failed(rs) or "not run")
    else:
        dev = next(r for r in rs if r["init_flatten"] == "device")["setup"]["build_ms"]
        host = next(r for r in rs if r["init_flatten"] == "host")["setup"]["build_ms"]
        eager = next((r for r in rs if r["init_flatten"] == "device-eager"), None)
        note = f"host {host / 1000:.2f} vs device {dev / 1000:.2f} s"
        if eager:  # issue 36 item 4's goal: the device build (draws deferred onto the GPU) <= 1 s
            note += f" (draws deferred to the GPU; drawn on the host first: {eager['setup']['build_ms'] / 1000:.2f} s)"
        large = next((r for r in rs if r["init_flatten"] == "device-large"), None)
        if large:  # item 4's second goal: the host's footprint while a larger GPT is built on the device
            st = large["setup"]
            note += (f"; a {st['n_params'] / 1e9:.2f}B GPT drawn on the GPU in {st['build_ms'] / 1000:.2f} s, "
                     f"host peak RSS {gb(st['peak_rss_bytes'])} (its fp32 weights: {gb(4 * st['n_params'])})")
        rows["003"] = (f"{host / dev:.2f}×", note + "; one build each")
    return rows


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "bench/results/gpu.json"
    run = json.load(open(path))
    out = []
    w = out.append
    w(f"# zero-cpp on one GPU: {run['device']}\n")
    w(f"- {run['date']}; torch {run['torch']}; DeepSpeed {run.get('deepspeed') or 'not importable'} "
      f"(AdamW: {run.get('ds_adam')}); model `{run['model']}`, micro-batch {run['micro_batch']}, 1 rank")
    w(f"- {run['steps']} steps per run; step ms is the median of {run['timed_steps']}; every figure below comes "
      f"from this one run ({run['elapsed_s']} s of a {run['budget_s']} s budget)")
    w("- zero-cpp's step ms: wall time of a step up to its loss read back (a device sync); the peers': up to "
      "`torch.cuda.synchronize()`. Loss difference: max over steps of |loss − zero-cpp's at the same stage|, "
      "bf16 (runs compute in bf16, so ~1e-2 is expected)\n")
    main_table(w, run)
    w("Seeds' ratios (measured in this run, beside the seed's own figure):\n")
    w("| seed | ratio | measured here | seed's figure | notes |")
    w("|---|---|---|---|---|")
    for seed, (value, note) in seed_rows(run).items():
        what, theirs = SEEDS[seed]
        w(f"| {seed} | {what} | {value} | {theirs} | {note} |")
    w("")
    text = "\n".join(out)
    print(text)
    if len(sys.argv) > 2:
        open(sys.argv[2], "w").write(text + "\n")


if __name__ == "__main__":
    main()
