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


def main():
    stages, ddp = load("stages.json"), load("ddp.json")
    out = []
    w = out.append
    w("# zero-cpp benchmark report\n")
    w(f"- date: {datetime.date.today()}; machine: {cpu_model()}, {os.cpu_count()} cores")
    w("- 2 local ranks, 1 thread per rank (zero-run and the DDP peer alike); fp32 compute")
    w("- every timing below comes from one `./run bench` invocation: compare as ratios\n")

    if stages:
        peers = {r["run"]: r["result"] for r in (ddp or {}).get("runs", [])}
        w("## Stages against PyTorch DDP\n")
        w("| model | dtype | run | step ms | vs DDP | tokens/s | peak RSS / rank | model state / rank | "
          "collective MB / step | max loss diff vs DDP |")
        w("|---|---|---|---|---|---|---|---|---|---|")
        for model in ("gpt_small", "gpt_big"):
            peer = peers.get(model)
            runs = [r for r in stages["runs"] if r["run"] == model]
            if not runs:
                continue
            if peer:
                w(f"| {model} | fp32 | DDP (torch {peer['torch']}) | {peer['median_step_ms']:.0f} | 1.00× | | "
                  f"{mb(peer['peak_rss_bytes'])} | | | |")
            for r in runs:
                s = r["summary"]
                comm = sum(c["bytes"] for op, c in s.get("last_step_comm", {}).items())
                ratio = f"{s['median_step_ms'] / peer['median_step_ms']:.2f}×" if peer else ""
                diff = ""
                if peer and r["dtype"] == "fp32":
                    n = min(len(peer["losses"]), len(r["losses"]))
                    diff = f"{max(abs(a - b) / abs(b) for a, b in zip(r['losses'][:n], peer['losses'][:n])):.1e} rel"
                w(f"| {model} | {r['dtype']} | stage {r['stage']} | {s['median_step_ms']:.0f} | {ratio} | "
                  f"{s['tokens_per_s']:.0f} | {mb(s['peak_rss_bytes'])} | {mb(s['model_state_bytes'])} | "
                  f"{comm / 1e6:.1f} | {diff} |")
        w("\nBoth start from the same weights and see the same batches. The parity tests' tolerance is 2e-5 "
          "relative. For scale, the largest relative loss difference between zero-cpp's own fp32 stages "
          "(which differ only in the order of float sums):")
        for model in ("gpt_small", "gpt_big"):
            runs = [r for r in stages["runs"] if r["run"] == model and r["dtype"] == "fp32"]
            if len(runs) > 1:
                spread = max(abs(a - b) / abs(b) for r in runs for q in runs for a, b in zip(r["losses"], q["losses"]))
                w(f"- {model}: {spread:.1e}")
        w("\nWhere training is unstable (a loss that jumps up in the first steps), last-bit differences "
          "between two AdamW implementations grow along the trajectory as they do between the stages.\n")
        small = [r for r in stages["runs"] if r["run"] == "gpt_small"]
        peer = peers.get("gpt_small")
        lines = []
        if peer:
            open(os.path.join(R, "loss_ddp.dat"), "w").write("\n".join(f"{i + 1} {l}" for i, l in enumerate(peer["losses"])))
            lines.append(f"'{R}/loss_ddp.dat' with lines lw 3 title 'DDP'")
        for r in small:
            name = f"loss_s{r['stage']}_{r['dtype']}.dat"
            open(os.path.join(R, name), "w").write("\n".join(f"{i + 1} {l}" for i, l in enumerate(r["losses"])))
            lines.append(f"'{R}/{name}' with lines dt {2 if r['dtype'] == 'bf16' else 1} "
                         f"title 'stage {r['stage']} {r['dtype']}'")
        if lines and gnuplot(f"set terminal png size 900,500\nset output '{R}/loss.png'\nset xlabel 'step'\n"
                             f"set ylabel 'loss'\nset title 'GPT 4x256: loss per step'\nplot {', '.join(lines)}\n"):
            w("![loss curves](loss.png)\n")
        for model in ("gpt_small", "gpt_big"):
            runs = [r for r in stages["runs"] if r["run"] == model]
            if not runs:
                continue
            dat = os.path.join(R, f"time_{model}.dat")
            with open(dat, "w") as f:
                if peers.get(model):
                    f.write(f"DDP {peers[model]['median_step_ms']} {peers[model]['peak_rss_bytes'] / 1e6}\n")
                for r in runs:
                    f.write(f"s{r['stage']}-{r['dtype']} {r['summary']['median_step_ms']} "
                            f"{r['summary']['peak_rss_bytes'] / 1e6}\n")
            if gnuplot(f"set terminal png size 900,500\nset output '{R}/time_{model}.png'\nset style data histograms\n"
                       f"set style fill solid 0.6\nset ylabel 'ms / step'\nset y2label 'peak RSS MB'\nset y2tics\n"
                       f"set yrange [0:*]\nset y2range [0:*]\n"
                       f"set title '{model}: step time and peak RSS per rank'\nset xtics rotate by -30\n"
                       f"plot '{dat}' using 2:xtic(1) title 'step ms', '' using 3 axes x1y2 title 'peak RSS MB'\n"):
                w(f"![{model} step time and memory](time_{model}.png)\n")

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

    w("## Largest model per stage\n")
    w("Measured separately (minutes per probe; see the README): a 1.02 B-param GPT (16 × 2304) trains with "
      "stage 3 on 2 ranks each limited to 12 GiB (`ulimit -v`); stage 0 stops at init under the same limit.\n")
    open(os.path.join(R, "report.md"), "w").write("\n".join(out) + "\n")
    print(f"report: {os.path.join(R, 'report.md')}")


if __name__ == "__main__":
    main()
