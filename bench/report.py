"""Turns bench/results/*.json into bench/results/report.md and PNG charts
(gnuplot). Standard library only. Every timing in the report is a ratio or a
figure taken side by side in one `./run bench` invocation.

    python3 bench/report.py bench/results
"""
import datetime
import json
import os
import platform
import subprocess
import sys

R = sys.argv[1] if len(sys.argv) > 1 else "bench/results"


def load(name):
    path = os.path.join(R, name)
    return json.load(open(path)) if os.path.exists(path) else None


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def mb(b):
    return f"{b / 1e6:.0f} MB"


def table(w, title, columns, rows):
    w(f"## {title}\n")
    w("| " + " | ".join(columns) + " |")
    w("|" + "---|" * len(columns))
    for r in rows:
        w("| " + " | ".join(r) + " |")
    w("")


def pairs(runs):
    """Consecutive runs two by two (each benchmark writes a pair per case)."""
    return zip(runs[0::2], runs[1::2])


def gnuplot(script):
    script = script.replace("\n", "\nset termoption noenhanced\n", 1)  # names with '_' print as they are
    try:
        subprocess.run(["gnuplot"], input=script, text=True, check=True, capture_output=True)
        return True
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"report: gnuplot failed ({e}); charts skipped", file=sys.stderr)
        return False


def peer_label(p):
    name = {"ddp": "DDP", "fsdp2": "FSDP2", "deepspeed": f"DeepSpeed stage {p['stage']}"}[p["peer"]]
    return f"{name} {p['dtype']}"


def max_rel_diff(a, b):
    n = min(len(a), len(b))
    return max(abs(x - y) / abs(y) for x, y in zip(a[:n], b[:n])) if n else float("nan")


def against_peers(w, stages, peers):
    """The table of every run against DDP, the goals as ratios, and the charts."""
    for model in ("gpt_small", "gpt_big"):
        mine = [r for r in stages["runs"] if r["run"] == model]
        theirs = [p for p in peers["runs"] if p["run"] == model]
        if not mine:
            continue
        ddp = next((p["result"] for p in theirs if p["peer"] == "ddp"), None)
        w(f"## {model}: zero-cpp and the peers\n")
        w("| run | step ms | vs DDP | peak RSS / rank | model state / rank | max loss diff vs DDP (rel) |")
        w("|---|---|---|---|---|---|")
        rows = [(peer_label(p), p["result"]["median_step_ms"], p["result"]["peak_rss_bytes"],
                 p["result"].get("model_state_bytes"), p["result"]["losses"], p["dtype"]) for p in theirs]
        rows += [(f"zero-cpp stage {r['stage']} {r['dtype']}", r["summary"]["median_step_ms"],
                  r["summary"]["peak_rss_bytes"], r["summary"]["model_state_bytes"], r["losses"], r["dtype"])
                 for r in mine]
        for name, ms, rss, state, losses, dtype in rows:
            ratio = f"{ms / ddp['median_step_ms']:.2f}×" if ddp else ""
            diff = f"{max_rel_diff(losses, ddp['losses']):.1e}" if ddp and dtype == "fp32" else ""
            w(f"| {name} | {ms:.0f} | {ratio} | {mb(rss)} | {mb(state) if state else ''} | {diff} |")
        w("")
        goals(w, model, mine, theirs, stages.get("ranks", 2))
        charts(w, model, rows)


def goals(w, model, mine, theirs, n):
    def ours(stage, dtype):
        return next((r["summary"] for r in mine if r["stage"] == stage and r["dtype"] == dtype), None)

    def peer(name, stage, dtype):
        return next((p["result"] for p in theirs if p["peer"] == name and p["stage"] == stage
                     and p["dtype"] == dtype), None)

    lines = []
    def ratio(label, a, b, key, goal):
        if a and b:
            lines.append(f"| {label} | {a[key] / b[key]:.2f} | {goal} |")

    ratio("stage 0 ÷ DDP, step time, fp32", ours(0, "fp32"), peer("ddp", 0, "fp32"), "median_step_ms", "≤ 0.95")
    for dt in ("fp32", "bf16"):
        ratio(f"stage 3 ÷ DeepSpeed stage 3, step time, {dt}", ours(3, dt), peer("deepspeed", 3, dt),
              "median_step_ms", "≤ 0.7")
        ratio(f"stage 3 ÷ FSDP2, step time, {dt}", ours(3, dt), peer("fsdp2", 3, dt), "median_step_ms", "≤ 0.75")
    ratio("stage 3 ÷ stage 0, step time, fp32", ours(3, "fp32"), ours(0, "fp32"), "median_step_ms", "≤ 1.05")
    for dt in ("fp32", "bf16"):
        ratio(f"stage 3 ÷ DeepSpeed stage 3, peak RSS, {dt}", ours(3, dt), peer("deepspeed", 3, dt),
              "peak_rss_bytes", "≤ 0.5")
        ratio(f"stage 3 ÷ FSDP2, peak RSS, {dt}", ours(3, dt), peer("fsdp2", 3, dt), "peak_rss_bytes", "< 1 (lowest)")
    s0, s3 = ours(0, "fp32"), ours(3, "fp32")
    if s0 and s3:
        psi = s0["model_state_bytes"] / 16  # stage 0 holds 16 bytes per param in fp32 with Adam
        saved = s0["peak_rss_bytes"] - s3["peak_rss_bytes"]
        lines.append(f"| stage 0 − stage 3 peak RSS ÷ 16Ψ(1 − 1/N) | {saved / (16 * psi * (1 - 1 / n)):.2f} | ≥ 0.9 |")
    if lines:
        w(f"Goals ({model}):\n")
        w("| ratio | measured | goal |")
        w("|---|---|---|")
        for line in lines:
            w(line)
        w("")


def charts(w, model, rows):
    dat = os.path.join(R, f"time_{model}.dat")
    with open(dat, "w") as f:
        for name, ms, rss, *_ in rows:
            f.write(f'"{name}" {ms} {rss / 1e6}\n')
    if gnuplot(f"set terminal png size 1000,550\nset output '{R}/time_{model}.png'\nset style data histograms\n"
               f"set style fill solid 0.6\nset ylabel 'ms / step'\nset y2label 'peak RSS MB'\nset y2tics\n"
               f"set yrange [0:*]\nset y2range [0:*]\nset bmargin 8\n"
               f"set title '{model}: step time and peak RSS per rank'\nset xtics rotate by -40\n"
               f"plot '{dat}' using 2:xtic(1) title 'step ms', '' using 3 axes x1y2 title 'peak RSS MB'\n"):
        w(f"![{model} step time and memory](time_{model}.png)\n")
    losses = [(name, l) for name, _, _, _, l, dtype in rows if dtype == "fp32"]
    lines = []
    for k, (name, l) in enumerate(losses):
        path = os.path.join(R, f"loss_{model}_{k}.dat")
        open(path, "w").write("\n".join(f"{i + 1} {x}" for i, x in enumerate(l)))
        lines.append(f"'{path}' with lines title '{name}'")
    if lines and gnuplot(f"set terminal png size 900,500\nset output '{R}/loss_{model}.png'\nset xlabel 'step'\n"
                         f"set ylabel 'loss'\nset title '{model}: loss per step, fp32'\nplot {', '.join(lines)}\n"):
        w(f"![{model} loss curves](loss_{model}.png)\n")


def main():
    stages, peers = load("stages.json"), load("peers.json")
    out = []
    w = out.append
    w("# zero-cpp benchmark report\n")
    w(f"- date: {datetime.date.today()}; machine: {cpu_model()}, {os.cpu_count()} cores")
    w("- 2 local ranks, 1 thread per rank (zero-run and the peers alike)")
    w("- every timing below comes from one `./run bench` invocation: compare as ratios\n")
    if stages:
        against_peers(w, stages, peers or {"runs": []})
    fast = load("fastpath.json")
    if fast:
        table(w, "Shared-memory fast path against Gloo (end to end)",
              ["model", "dtype", "stage", "fast path ms", "Gloo ms", "Gloo ÷ fast", "peak RSS fast / Gloo"],
              [[a["model"], a["dtype"], str(a["stage"]), f"{sa['median_step_ms']:.0f}", f"{sb['median_step_ms']:.0f}",
                f"{sb['median_step_ms'] / sa['median_step_ms']:.2f}×",
                f"{mb(sa['peak_rss_bytes'])} / {mb(sb['peak_rss_bytes'])}"]
               for a, b in pairs(fast["runs"]) for sa, sb in [(a["summary"], b["summary"])]])

    comm = load("comm.json")
    if comm:
        ops = ("allgather_gbps", "reduce_scatter_gbps", "all_reduce_gbps")
        table(w, "Collective bandwidth (fp32, 2 ranks; GB/s of the full buffer)",
              ["bytes", "memcpy", "allgather shm / gloo", "reduce-scatter shm / gloo", "all-reduce shm / gloo"],
              [[str(r["bytes"]), f"{r['memcpy_gbps']:.1f}"] + [f"{r['shm'][k]:.2f} / {r['gloo'][k]:.2f}" for k in ops]
               for r in comm["rows"]])
        dat = os.path.join(R, "comm.dat")
        with open(dat, "w") as f:
            for r in comm["rows"]:
                f.write(f"{r['bytes']} {r['memcpy_gbps']} {r['shm']['allgather_gbps']} {r['gloo']['allgather_gbps']} "
                        f"{r['shm']['reduce_scatter_gbps']} {r['gloo']['reduce_scatter_gbps']}\n")
        if gnuplot(f"set terminal png size 900,500\nset output '{R}/comm.png'\nset logscale x 2\nset logscale y\n"
                   f"set xlabel 'message bytes'\nset ylabel 'GB/s'\nset key left\n"
                   f"plot '{dat}' u 1:2 w lp t 'memcpy', '' u 1:3 w lp t 'allgather shm', '' u 1:4 w lp t 'allgather gloo', "
                   f"'' u 1:5 w lp t 'reduce-scatter shm', '' u 1:6 w lp t 'reduce-scatter gloo'\n"):
            w("![bandwidth](comm.png)\n")

    coal = load("coalesce.json")
    if coal:
        rs_calls = lambda run: str(run["summary"]["last_step_comm"].get("reduce_scatter", {}).get("calls", 0))
        table(w, "Four backward passes per step, with and without coalesce_grad_reduction",
              ["stage", "separate ms", "coalesced ms", "ratio", "reduce-scatter calls per step"],
              [[str(a["stage"]), f"{a['summary']['median_step_ms']:.0f}", f"{b['summary']['median_step_ms']:.0f}",
                f"{a['summary']['median_step_ms'] / b['summary']['median_step_ms']:.2f}×", f"{rs_calls(a)} → {rs_calls(b)}"]
               for a, b in pairs(coal["runs"])])

    ck = load("ckpt.json")
    if ck:
        table(w, "Checkpoints (GPT 8x1024, 2 ranks)",
              ["stage", "bytes", "save s", "÷ plain write", "load s", "÷ plain read"],
              [[str(r["stage"]), mb(r["bytes"]), f"{r['save_ms'] / 1000:.2f}", f"{r['save_over_plain']:.2f}",
                f"{r['load_ms'] / 1000:.2f}", f"{r['load_over_plain']:.2f}"] for r in ck["runs"]])

    alloc = load("allocators.json")
    if alloc:
        rows = []
        for stage in (0, 3):
            runs = [r for r in alloc["runs"] if r["stage"] == stage]
            base = [r for r in runs if r["policy"] == "fixed-1MiB"]
            for r in runs:
                s, b = r["summary"], (base[0]["summary"] if base else None)
                rows.append([str(stage), r["policy"], f"{s['median_step_ms']:.0f}",
                             f"{s['median_step_ms'] / b['median_step_ms']:.2f}" if b else "",
                             mb(s["peak_rss_bytes"]), f"{s['peak_rss_bytes'] / b['peak_rss_bytes']:.2f}" if b else ""])
        table(w, "Allocation policies (GPT 8x1024, fp32, 2 ranks)",
              ["stage", "policy", "step ms", "÷ fixed-1MiB", "peak RSS / rank", "÷ fixed-1MiB"], rows)

    goal_run = load("goals.json")
    if goal_run:
        table(w, f"Issue 34's goals in one invocation (GPT {goal_run['model']}, fp32, 2 ranks, "
                 f"{goal_run['rounds']} round(s), bench/goals.sh)",
              ["ratio", "measured", "each round", "goal", "met"],
              [[k, f"{g['ratio']:.2f}", ", ".join(f"{r:.2f}" for r in g.get("rounds", [])), g["goal"],
                "yes" if g["met"] else "no"] for k, g in goal_run["goals"].items()])

    py = load("python_frontend.json")
    if py:
        table(w, f"Issue 35's goals: the Python front end against the peers and the C++ API (GPT {py['model']}, "
                 f"fp32, 2 ranks, {py['rounds']} round(s), bench/python_frontend.sh)",
              ["ratio", "measured", "each round", "goal", "met"],
              [[k, f"{g['ratio']:.2f}", ", ".join(f"{r:.2f}" for r in g.get("rounds", [])), g.get("goal", ""),
                ("yes" if g["met"] else "no") if "met" in g else ""]
               for k, g in {**py["goals"], **py["figures"]}.items()])
        if py.get("stage3_hooks"):
            h = py["stage3_hooks"]
            w(f"Stage 3's module hooks per step: {h['calls_per_step']:.0f} calls, {h['hooks_ms_per_step']:.1f} ms, "
              f"of which {h['in_cpp_engine_ms']:.1f} ms in the C++ engine (gathers) and {h['python_ms']:.2f} ms "
              f"Python's ({h['python_share_of_step']:.2%} of the step).\n")

    first = load("first_step.json")
    if first:
        table(w, f"Time to the first step (GPT {first['model']}, fp32, 2 ranks, rank 0's process age in s, "
                 f"medians of {first['rounds']} rounds, bench/first_step.sh)",
              ["run", "rendezvous done", "ready to step", "first step done"],
              [[k, *(f"{v[p] / 1000:.1f}" for p in ("rendezvous", "ready", "first_step"))]
               for k, v in first["medians_ms"].items()])
        w("Ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in first["ratios"].items()) + "\n")

    inf = load("infinity.json")
    if inf:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from infinity_figures import figures
        f = figures(inf)
        table(w, f"ZeRO-Infinity: a {f['params'] / 1e9:.2f} B-param GPT, params, grads and optimizer state on NVMe",
              ["model state", "RAM", "peak RSS / rank", "step s", "I/O bound s", "compute s (in memory)",
               "step ÷ larger bound", "losses vs in memory (101M)"],
              [[f"{f['model_state_gb']:.1f} GB", f"{f['ram_gb']:.1f} GB",
                f"{f['peak_rss_gb_per_rank']:.2f} GB ({f['peak_rss_over_ram']:.0%})", f"{f['step_s']:.0f}",
                f"{f['io_bound_s']:.0f}", f"{f['compute_s']:.0f}", f"{f['step_over_bound']:.2f}",
                f"max rel. diff {f['parity_losses_max_rel_diff']:.1e}"]])

    w("## Largest model per stage\n")
    w("Measured separately (minutes per probe; see docs/benchmarks.md): a 1.02 B-param GPT (16 × 2304) trains with "
      "stage 3 on 2 ranks each limited to 12 GiB (`ulimit -v`); stage 0 stops at init under the same limit.\n")
    open(os.path.join(R, "report.md"), "w").write("\n".join(out) + "\n")
    print(f"report: {os.path.join(R, 'report.md')}")


if __name__ == "__main__":
    main()
