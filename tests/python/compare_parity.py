"""Holds zero_cpp's run of parity_train.py to DeepSpeed's: the issue's
tolerances, every scenario at every stage either ran. Exits non-zero naming
each miss.

    compare_parity.py ZERO_CPP.json DEEPSPEED.json
"""
import json
import sys

FP32_REL = 1e-4   # the issue's: fp32 losses within 1e-4 relative
BF16_REL = 5e-3   # bf16 keeps 8 bits of mantissa: a few roundings of 2^-9
# torch_autocast: the same bf16 forward; DeepSpeed reduces the Linears'
# grads in bf16 where zero_cpp reduces all in fp32 (~1e-5 apart after 6 steps).
# fp16_auto_cast: fp16's roundings (7e-5 apart after 3 steps).
AUTOCAST_REL = 1e-3


def rel(a, b):
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))


def same_calls(a, b, tol):
    """Two records of client calls: the same calls, names, steps and
    arguments; numbers within `tol` relative (a loss), or equal."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
            abs(a - b) <= tol * max(abs(b), 1e-12)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_calls(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_calls(a[k], b[k], tol) for k in b)
    return a == b


def main():
    zc, ds = (json.load(open(p)) for p in sys.argv[1:3])
    misses, lines = [], []

    def check(ok, what):
        lines.append(("ok   " if ok else "MISS ") + what)
        if not ok:
            misses.append(what)

    for name, stages in ds.items():
        tol = BF16_REL if name in ("bf16", "init_bf16") else AUTOCAST_REL if name in ("autocast", "fp16_auto_cast") \
            else FP32_REL
        for stage, d in stages.items():
            z = zc.get(name, {}).get(stage)
            if z is None:
                check(False, f"{name} stage {stage}: zero_cpp has no run")
                continue
            check(len(z["losses"]) == len(d["losses"]), f"{name} stage {stage}: {len(z['losses'])} steps")
            r = rel(z["losses"], d["losses"])
            check(r <= tol, f"{name} stage {stage}: losses within {r:.2e} relative of DeepSpeed's (<= {tol:g})")
            if name == "client":
                check(abs(z["lr"] - d["lr"]) <= 1e-12, f"client stage {stage}: the LambdaLR's lr {z['lr']} vs {d['lr']}")
            if name == "groups":
                check(z["lrs"] == d["lrs"], f"groups stage {stage}: the groups' lrs {z['lrs']} vs {d['lrs']}")
            if name == "base":  # safe_get_full_fp32_param where DeepSpeed has an fp32 master
                for pname, dv in d["fp32_params"].items():
                    zv = z["fp32_params"].get(pname)
                    if dv is None:
                        continue
                    check(zv is not None and zv[0] == dv[0] and abs(zv[1] - dv[1]) <= tol * abs(dv[1]),
                          f"base stage {stage}: safe_get_full_fp32_param({pname}): {zv} vs DeepSpeed's {dv}")
                for kind, params in d["full_state"].items():  # safe_get_full_grad, safe_get_full_optimizer_state
                    bad = [(pname, z["full_state"][kind].get(pname), dv) for pname, dv in params.items()
                           if dv is not None and not (z["full_state"][kind].get(pname) is not None and
                                                      z["full_state"][kind][pname][0] == dv[0] and
                                                      abs(z["full_state"][kind][pname][1] - dv[1]) <=
                                                      max(tol * abs(dv[1]), 1e-12))]
                    compared = sum(dv is not None for dv in params.values())
                    if compared == 0 and int(stage) == 0 and kind != "grad":
                        continue  # DeepSpeed's stage 0 in fp32 has no optimizer wrapper to ask: None
                    check(compared > 0 and not bad, f"base stage {stage}: safe_get_full {kind} of {compared} params "
                          f"as DeepSpeed's{'' if not bad else f' -- differ: {bad[:2]}'}")
            if name == "features":
                check(z["global_steps"] == d["global_steps"], f"features stage {stage}: global_steps "
                      f"{z['global_steps']} vs {d['global_steps']}")
                check(abs(z["lr"] - d["lr"]) <= 1e-12, f"features stage {stage}: lr {z['lr']} vs {d['lr']}")
            if name == "resume":
                check(z["loaded"], f"resume stage {stage}: a checkpoint was loaded")
                check(z["resumed"] == z["losses"][3:], f"resume stage {stage}: the resumed run's losses are exactly "
                      f"those of the run that went on ({z['resumed']} vs {z['losses'][3:]})")
                check(rel(z["resumed"], d["resumed"]) <= tol, f"resume stage {stage}: resumed losses match "
                      f"DeepSpeed's resumed run")
                check(z["client_state"] == d["client_state"], f"resume stage {stage}: client_state back")
                check(z["global_steps"] == d["global_steps"], f"resume stage {stage}: global_steps after resuming")
            if name == "autocast":
                check(z["computed_in"] == d["computed_in"] and "head:torch.bfloat16" in d["computed_in"],
                      f"autocast stage {stage}: the Linears computed in {z['computed_in']} vs DeepSpeed's "
                      f"{d['computed_in']}")
                check(z["autocast"] == d["autocast"] and z["param_dtypes"] == d["param_dtypes"],
                      f"autocast stage {stage}: engine.torch_autocast_* and the params' dtypes {z['autocast']} "
                      f"{z['param_dtypes']} vs DeepSpeed's {d['autocast']} {d['param_dtypes']}")
            if name == "leaf_modules":
                check(z["leaves"] == d["leaves"], f"leaf_modules stage {stage}: the leaves {z['leaves']} vs "
                      f"DeepSpeed's {d['leaves']}")
            if name == "schedule_resumed":
                check(rel(z["lrs"], d["lrs"]) <= 1e-12, f"schedule_resumed stage {stage}: the lrs each step took "
                      f"{z['lrs']} vs DeepSpeed's {d['lrs']}")
            if name == "accessors":
                differ = {k: (z["values"].get(k), v) for k, v in d["values"].items() if z["values"].get(k) != v}
                check(not differ, f"accessors stage {stage}: {len(d['values'])} config accessors as DeepSpeed's"
                      + (f" -- differ (zero_cpp, DeepSpeed): {differ}" if differ else ""))
                same = z["module_state_dict"] == d["module_state_dict"]
                check(same, f"accessors stage {stage}: module_state_dict's {len(d['module_state_dict'])} keys without "
                      f"the frozen params" + ("" if same else f": {z['module_state_dict']} vs {d['module_state_dict']}"))
            if name == "fp16_auto_cast":
                check(z["auto_cast"] is True and d["auto_cast"] is True, f"fp16_auto_cast stage {stage}: "
                      f"engine.fp16_auto_cast() {z['auto_cast']} vs DeepSpeed's {d['auto_cast']}")
            if name == "moe":
                check(z["groups"] == d["groups"], f"moe stage {stage}: the optimizer's param groups {z['groups']} vs "
                      f"DeepSpeed's {d['groups']}")
            if name == "tiled":
                check(z["tiles"] == d["tiles"], f"tiled stage {stage}: the tiles' names {z['tiles']} vs {d['tiles']}")
            if name == "at_rest":
                check(z["read"] == d["read"], f"at_rest stage {stage}: released params read as DeepSpeed's "
                      f"({z['read']} vs {d['read']})")
            if name == "inference":
                check(r == 0.0, f"inference: the forwards' losses bit for bit DeepSpeed's ({z['losses']} vs "
                      f"{d['losses']})")
                for key in ("made_dtypes", "default", "merged"):
                    check(z[key] == d[key], f"inference: {key} as DeepSpeed's" +
                          ("" if z[key] == d[key] else f": {z[key]} vs {d[key]}"))
            if name == "trackers":
                for client in ("wandb", "comet"):
                    same = same_calls(z[client], d[client], tol)
                    check(same, f"trackers stage {stage}: {client}'s {len(d[client])} calls as DeepSpeed's" +
                          ("" if same else f": {z[client]} vs {d[client]}"))
                check(z["calls_per_rank"][1:] == [0] * (len(z["calls_per_rank"]) - 1),
                      f"trackers stage {stage}: only rank 0 calls the clients ({z['calls_per_rank']})")
            if name == "batch_warmup":
                check([z[k] for k in ("global_steps", "global_samples", "batch")] ==
                      [d[k] for k in ("global_steps", "global_samples", "batch")],
                      f"batch_warmup stage {stage}: steps, samples and batch after the changes "
                      f"{[z[k] for k in ('global_steps', 'global_samples', 'batch')]} vs DeepSpeed's "
                      f"{[d[k] for k in ('global_steps', 'global_samples', 'batch')]}")
            if name == "surgery":
                # Tighter than the issue's: a setter whose value reached the
                # params a step early (not at the next step, as DeepSpeed's)
                # moves these losses by ~5e-5; two engines' fp32 roundings by ~1e-7.
                check(r <= 1e-6, f"surgery stage {stage}: losses within {r:.2e} of DeepSpeed's (<= 1e-6)")
                for key, dv in d["read_back"].items():
                    zv = z["read_back"].get(key)
                    check(zv is not None and zv[0] == dv[0] and abs(zv[1] - dv[1]) <= 1e-6 * max(abs(dv[1]), 1e-12),
                          f"surgery stage {stage}: {key} read back after its setter: {zv} vs DeepSpeed's {dv}")
            if name in ("coalesce", "gradcache"):
                check(rel(z["losses"], z["uncoalesced_losses"]) <= tol,
                      f"{name} stage {stage}: coalesced losses equal the uncoalesced run's")
                check(rel(z["uncoalesced_losses"], d["uncoalesced_losses"]) <= tol,
                      f"{name} stage {stage}: uncoalesced losses match DeepSpeed's")
                n, steps = z["backwards_per_step"], z["steps"]
                separate, coalesced = z["uncoalesced_reduce_scatters"], z["reduce_scatters"]
                groups = coalesced / steps
                check(coalesced > 0 and coalesced % steps == 0, f"{name} stage {stage}: {coalesced} reduce-scatters "
                      f"in {steps} steps: {groups:g} per step (one per group)")
                if stage in ("2", "3"):  # each backward reduces there unless coalesced
                    check(separate == n * coalesced, f"{name} stage {stage}: {separate} reduce-scatters uncoalesced, "
                          f"{n} x the coalesced {coalesced}")
    print("\n".join(lines))
    if misses:
        print(f"{len(misses)} miss(es)")
        sys.exit(1)
    print(f"all {len(lines)} checks passed")


if __name__ == "__main__":
    main()
