"""Numbers as DeepSpeed's flops profiler writes them: scaled to a unit
prefix (T, G, M, K, none, m, u), rounded to `precision` decimals, with the
quantity's suffix ("1.5 GMACs", "3.2 ms", "110 M"). Scripts compare these
strings, so they are DeepSpeed's to the character."""

DEFAULT_PRECISION = 2

# Largest first: a number takes the first prefix it reaches; below 1e-3 it is in micro.
_PREFIXES = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3), ("", 1), ("m", 1e-3))


def number_to_string(num, units=None, precision=DEFAULT_PRECISION):
    """`num` with a unit prefix: chosen by its size, or `units` as given
    ("T", "G", "M", "K", "m", "u"; anything else scales by 1)."""
    if units is None:
        units, scale = next(((u, s) for u, s in _PREFIXES if num >= s), ("u", 1e-6))
        if num == 0:
            units, scale = "", 1
    else:
        scale = dict(_PREFIXES, u=1e-6).get(units, 1)
    return f"{round(num / scale, precision):g} {units}"


def macs_to_string(macs, units=None, precision=DEFAULT_PRECISION):
    return f"{number_to_string(macs, units=units, precision=precision)}MACs"


def flops_to_string(flops, units=None, precision=DEFAULT_PRECISION):
    """A rate: floating-point operations per second."""
    return f"{number_to_string(flops, units=units, precision=precision)}FLOPS"


def bytes_to_string(b, units=None, precision=DEFAULT_PRECISION):
    return f"{number_to_string(b, units=units, precision=precision)}B"


def params_to_string(params_num, units=None, precision=DEFAULT_PRECISION):
    """A parameter count, billions written B ("1.3 B"), no trailing space."""
    giga = units.replace("B", "G") if units else units
    return number_to_string(params_num, units=giga, precision=precision).replace("G", "B").strip()


def duration_to_string(duration, units=None, precision=DEFAULT_PRECISION):
    """Seconds."""
    return f"{number_to_string(duration, units=units, precision=precision)}s"
