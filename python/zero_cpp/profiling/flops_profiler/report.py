"""The text of print_model_profile: the totals, the top module types at each
depth, and the module tree with each module's profile."""
from collections import defaultdict

from .sums import get_module_duration, get_module_flops, get_module_macs
from .units import DEFAULT_PRECISION, duration_to_string, flops_to_string, macs_to_string, number_to_string, \
    params_to_string

_RULE = "-" * 90


def write_profile(out, prof, profile_step, module_depth, top_modules, detailed):
    """`prof`: a FlopsProfiler that has profiled (before end_profile())."""
    model, engine = prof.model, prof.ds_engine
    flops, macs = prof.get_total_flops(), prof.get_total_macs()
    params, fwd_latency = prof.get_total_params(), prof.get_total_duration()
    mp_size = getattr(engine, "mp_world_size", 1) or 1
    batch = getattr(engine, "train_micro_batch_size_per_gpu", None)
    batch = batch() if callable(batch) else None

    def line(label, value):
        print(f"{label + ':':<64}{value}", file=out)

    print(f"{' Flops Profiler ':-^90}", file=out)
    print(f"Profile at step {profile_step}. Per GPU: this process's model; \"of model\": times the model "
          "parallel size (mp_size).", file=out)
    if engine is not None:
        for label, value in (("world size", getattr(engine, "world_size", None)),
                             ("data parallel size", getattr(engine, "dp_world_size", None)),
                             ("model parallel size", mp_size), ("batch size per GPU", batch)):
            if value is not None:
                line(label, value)
    line("params per GPU", params_to_string(params))
    line("params of model = params per GPU * mp_size", params_to_string(params * mp_size))
    line("fwd MACs per GPU", macs_to_string(macs))
    line("fwd flops per GPU", number_to_string(flops))
    line("fwd flops of model = fwd flops per GPU * mp_size", number_to_string(flops * mp_size))

    timers = _breakdown_timers(engine)
    if timers is not None:
        fwd_latency = timers("fwd").elapsed(False) / 1000.0
    line("fwd latency", duration_to_string(fwd_latency))
    line("fwd FLOPS per GPU = fwd flops per GPU / fwd latency", _rate(flops, fwd_latency))
    if timers is not None:
        # The backward does twice the forward's work, plus the share it recomputes.
        factor = 2 + prof.recompute_fwd_factor
        bwd_latency = timers("bwd").elapsed(False) / 1000.0
        step_latency = timers("step").elapsed(False) / 1000.0
        iter_latency = fwd_latency + bwd_latency + step_latency
        line("bwd latency", duration_to_string(bwd_latency))
        line(f"bwd FLOPS per GPU = {factor:g} * fwd flops per GPU / bwd latency", _rate(factor * flops, bwd_latency))
        line(f"fwd+bwd FLOPS per GPU = {factor + 1:g} * fwd flops per GPU / (fwd+bwd latency)",
             _rate((factor + 1) * flops, fwd_latency + bwd_latency))
        line("step latency", duration_to_string(step_latency))
        line("iter latency", duration_to_string(iter_latency))
        line(f"FLOPS per GPU = {factor + 1:g} * fwd flops per GPU / iter latency",
             _rate((factor + 1) * flops, iter_latency))
        if batch is not None and iter_latency:
            samples = batch * (getattr(engine, "world_size", None) or 1)
            line("samples/second", round(samples / iter_latency, DEFAULT_PRECISION))

    print(f"\n{' Aggregated profile per GPU ':-^90}", file=out)
    write_aggregated_profile(out, model, module_depth, top_modules)

    if detailed:
        print(f"\n{' Detailed profile per GPU ':-^90}", file=out)
        print("Each module: params, MACs and fwd latency, each with its share of the model's, then its fwd FLOPS.\n"
              "A module's own calls (a loss, a functional) count to it, not to a submodule, so a parent's MACs\n"
              "or latency can exceed the sum of its children's. Flops are an estimate from shapes, and the\n"
              "model's fwd latency is measured around its forward, so it leaves out what runs outside it.\n",
              file=out)
        _write_tree(out, model, "", 0, (params, macs, get_module_duration(model)))
    print(_RULE, file=out)


def write_aggregated_profile(out, model, module_depth, top_modules):
    """Per depth, module types summed: the `top_modules` largest by params,
    MACs and latency. Depths 0 to module_depth - 1, or all for -1."""
    by_depth = defaultdict(lambda: defaultdict(lambda: [0, 0, 0.0]))  # depth -> type -> [params, MACs, seconds]

    def walk(module, depth):
        sums = by_depth[depth][type(module).__name__]
        sums[0] += module.__params__
        sums[1] += get_module_macs(module)
        sums[2] += get_module_duration(module)
        for child in module.children():
            walk(child, depth + 1)

    walk(model, 0)
    depths = len(by_depth) if module_depth == -1 else min(module_depth, len(by_depth))
    print(f"Top {top_modules} modules by params, MACs or fwd latency at each model depth:", file=out)
    for depth in range(depths):
        print(f"depth {depth}:", file=out)
        for label, index, to_string in (("params", 0, params_to_string), ("MACs", 1, macs_to_string),
                                        ("fwd latency", 2, duration_to_string)):
            top = sorted(by_depth[depth].items(), key=lambda item: item[1][index], reverse=True)[:top_modules]
            print(f"    {label:<11} - {({name: to_string(sums[index]) for name, sums in top})}", file=out)


def _write_tree(out, module, name, indent, totals):
    params, macs, duration = module.__params__, get_module_macs(module), get_module_duration(module)
    shares = [f"{to_string(value)} = {_percent(value, total):g}% {label}"
              for value, total, label, to_string in ((params, totals[0], "Params", params_to_string),
                                                     (macs, totals[1], "MACs", macs_to_string),
                                                     (duration, totals[2], "latency", duration_to_string))]
    profile = ", ".join(shares + [_rate(get_module_flops(module), duration)]
                        + ([module.extra_repr()] if module.extra_repr() else []))
    head = " " * indent + (f"({name}): " if name else "") + type(module).__name__
    children = list(module.named_children())
    if not children:
        print(f"{head}({profile})", file=out)
        return
    print(f"{head}(\n{' ' * (indent + 2)}{profile}", file=out)
    for child_name, child in children:
        _write_tree(out, child, child_name, indent + 2, totals)
    print(" " * indent + ")", file=out)


def _percent(value, total):
    return round(100 * value / total, DEFAULT_PRECISION) if total else 0


def _rate(flops, seconds):
    return flops_to_string(flops / seconds if seconds else 0)


def _breakdown_timers(engine):
    """The engine's phase timers, if it times them (wall_clock_breakdown)."""
    breakdown = getattr(engine, "wall_clock_breakdown", None)
    timers = getattr(engine, "timers", None)
    return timers if callable(breakdown) and breakdown() and timers is not None else None
