"""The loss curve of a zero-train run as a PNG, drawn by gnuplot (Debian's
gnuplot-nox, as bench/report.py's charts are): each step's loss and its
running mean. Standard library only.

    python3 bench/loss_chart.py RUN.jsonl OUT.png [TITLE]

RUN.jsonl is zero-train's --log-json. Exit status 0: OUT.png written; 3: gnuplot
is not installed (nothing written; the message says how to get it); 1: any
other failure."""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def main(argv):
    if len(argv) not in (3, 4):
        print(__doc__, file=sys.stderr)
        return 2
    log, png = argv[1], argv[2]
    steps, setup = [], {}
    with open(log) as f:
        for line in f:
            r = json.loads(line)
            if r.get("event") == "step":
                steps.append((r["step"], r["loss"]))
            elif r.get("event") == "setup":
                setup = r
    if not steps:
        print(f"loss_chart: no step records in {log}", file=sys.stderr)
        return 1
    if not shutil.which("gnuplot"):
        print(f"loss_chart: gnuplot is not installed, so {png} was not drawn; install it "
              f"(apt-get install gnuplot-nox) and run: python3 bench/loss_chart.py {log} {png}", file=sys.stderr)
        return 3
    window = max(1, min(25, len(steps) // 10))
    title = argv[3] if len(argv) == 4 else (
        f"zero-train, stage {setup.get('stage', '?')}, {setup.get('world_size', '?')} ranks, "
        f"{setup.get('n_params', 0) / 1e6:.1f}M params")
    with tempfile.TemporaryDirectory() as tmp:
        dat = os.path.join(tmp, "loss.dat")
        with open(dat, "w") as f:
            for i, (step, loss) in enumerate(steps):
                recent = [l for _, l in steps[max(0, i + 1 - window):i + 1]]
                f.write(f"{step} {loss} {sum(recent) / len(recent)}\n")
        script = (f"set terminal png size 900,500\nset termoption noenhanced\nset output '{png}'\n"
                  f"set title '{title}'\nset xlabel 'optimizer step'\nset ylabel 'loss (global batch mean)'\n"
                  f"set grid\nplot '{dat}' using 1:2 with lines lc rgb '#a0c0e0' title 'loss', "
                  f"'{dat}' using 1:3 with lines lw 2 lc rgb '#1f4e99' title 'mean of {window} steps'\n")
        try:
            subprocess.run(["gnuplot"], input=script, text=True, check=True, capture_output=True)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"loss_chart: gnuplot failed: {getattr(e, 'stderr', '') or e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
