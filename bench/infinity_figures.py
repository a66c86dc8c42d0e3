"""The figures issue 31's headline is judged by, from bench/infinity.sh's JSON:
the step time against the larger of the I/O bound (the bytes a step moves
through the disk at the bandwidth fio measured in the same run) and the
in-memory compute time (the same width at 2 and 4 layers, extrapolated per
layer); peak RSS per rank against RAM; the parity runs' losses.

    python3 bench/infinity_figures.py bench/results/infinity.json
"""
import json
import sys

# Bytes through the disk per shard element per step (bf16 params, fp32
# master, grads and Adam's two moments): the optimizer's 12 bytes read and
# written; the 2-byte shard read for the forward gather and the backward
# gather, and written by the step (which does not read it); the 4-byte fp32
# grad written by its reduction and read by the step.
READ_BYTES, WRITE_BYTES = 12 + 2 * 2 + 4, 12 + 2 + 4


def figures(j):
    big = j["big"]
    params = big["n_params"]
    layers = j["big_layers"]
    t2, t4 = (r["summary"]["median_step_ms"] / 1e3 for r in j["in_memory_width"])
    compute_s = t2 + (layers - 2) * (t4 - t2) / 2
    # The disk as fast as it was measured in the run, before or after the big model.
    read_gbps = max(j["disk_read_gbps"], j.get("disk_after_read_gbps") or 0)
    write_gbps = max(j["disk_write_gbps"], j.get("disk_after_write_gbps") or 0)
    io_s = params * READ_BYTES / (read_gbps * 1e9) + params * WRITE_BYTES / (write_gbps * 1e9)
    step_s = big["summary"]["median_step_ms"] / 1e3
    memory, nvme = j["parity"][0], j["parity"][1]
    worst = max(abs(a - b) / abs(a) for a, b in zip(memory["losses"], nvme["losses"]))
    return {
        "params": params,
        "model_state_gb": 16 * params / 1e9,  # fp32 master + Adam + bf16 param and grad: 16 bytes a param
        "ram_gb": j["ram_bytes"] / 1e9,
        "peak_rss_gb_per_rank": big["summary"]["peak_rss_bytes"] / 1e9,
        "peak_rss_over_ram": big["summary"]["peak_rss_bytes"] / j["ram_bytes"],
        "nvme_gb_per_rank": big["summary"]["nvme_state_bytes"] / 1e9,
        "step_s": step_s,
        "disk_read_write_gbps": [read_gbps, write_gbps],
        "io_bound_s": io_s,
        "compute_s": compute_s,
        "step_over_bound": step_s / max(io_s, compute_s),
        "parity_losses_max_rel_diff": worst,
        "parity_peak_rss_ratio": nvme["summary"]["peak_rss_bytes"] / memory["summary"]["peak_rss_bytes"],
        "parity_step_ratio": nvme["summary"]["median_step_ms"] / memory["summary"]["median_step_ms"],
    }


if __name__ == "__main__":
    print(json.dumps(figures(json.load(open(sys.argv[1]))), indent=1))
