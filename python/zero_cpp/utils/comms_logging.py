"""DeepSpeed's comms logger (`deepspeed.utils.comms_logging`, reached as
`deepspeed.comm.log_summary()` and the ds_config's comms_logger block): each
collective's latency and bandwidth, by op and message size.

Two sources feed it: the C++ engine's collectives (the dispatcher's log,
comm/comm_log.h: the time this rank spent in each, its call and its wait,
so a prefetched gather's overlap with compute is not counted), drained here
at each step and at each summary; and the calls a script makes through
zero_cpp.comm, timed around the call as DeepSpeed times them. Message
sizes and bandwidths are DeepSpeed's (a reduce-scatter's message is its
whole input, as there), except that bandwidth uses the group's size where
DeepSpeed's uses the world's."""
import math
import sys
from datetime import datetime

import torch
import torch.distributed as dist

from .. import _C
from .logging import log_dist
from .timer import trim_mean

_UNITS = ("B", "KB", "MB", "GB", "TB", "PB")


def convert_size(size_bytes):
    """`size_bytes` in the largest binary unit below it, as "4.0 KB"."""
    if size_bytes == 0:
        return "0B"
    i = min(int(math.floor(math.log(size_bytes, 1024))), len(_UNITS) - 1)
    return f"{round(size_bytes / 1024**i, 2)} {_UNITS[i]}"


def calc_bw_log(comm_op, size, duration_ms, n=None):
    """(algbw, busbw) in Gbps of `comm_op` moving a `size`-byte message in
    `duration_ms` over a group of `n` ranks (the world's by default), by
    DeepSpeed's formulas: a gather's message is one rank's shard, and a
    reduce-scatter's (its whole input) is scaled by n as a gather's is."""
    if n is None:
        n = dist.get_world_size() if dist.is_initialized() else 1
    duration_ms = max(duration_ms, 1e-9)
    if comm_op in ("all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor"):
        size *= n
        algbw, busbw = size / duration_ms, size / duration_ms * (n - 1) / n
    elif comm_op in ("all_reduce", "all_reduce_coalesced"):
        algbw, busbw = 2 * size / duration_ms, size / duration_ms * 2 * (n - 1) / n
    elif comm_op in ("all_to_all", "all_to_all_single"):
        algbw, busbw = size / duration_ms, size / duration_ms * (n - 1) / n
    else:  # point to point, broadcast, reduce, gather, scatter, barrier
        algbw = busbw = size / duration_ms
    # bytes per ms -> Gbit per s
    return algbw * 8 / 1e6, busbw * 8 / 1e6


class CommsLogger:
    """The records, {op: {message bytes: [count, [ms], [algbw], [busbw]]}},
    as DeepSpeed's get_raw_data() gives them."""

    def __init__(self):
        self.comms_dict = {}
        self._enabled = False
        self.verbose = False
        self.debug = False
        self.prof_all = True
        self.prof_ops = []

    @property
    def enabled(self):
        return self._enabled

    @enabled.setter
    def enabled(self, on):
        """Also the C++ dispatcher's log: on and off together (a script may set it directly)."""
        if self._enabled and not on:
            self.collect_engine_records()  # what ran while it was on
        self._enabled = bool(on)
        _C.comms_log_enable(self._enabled)

    def configure(self, enabled=None, verbose=None, prof_all=None, prof_ops=None, debug=None):
        for name, value in (("enabled", enabled), ("verbose", verbose), ("prof_all", prof_all),
                            ("prof_ops", prof_ops), ("debug", debug)):
            if value is not None:
                setattr(self, name, list(value) if name == "prof_ops" else bool(value))

    def start_profiling_comms(self):
        self.prof_all = True

    def stop_profiling_comms(self):
        self.prof_all = False

    def start_profiling_op(self, op_name_list):
        self.prof_ops = list(set(self.prof_ops) | set(op_name_list))

    def stop_profiling_op(self, op_name_list):
        self.prof_ops = [op for op in self.prof_ops if op not in op_name_list]

    def profiles(self, op):
        return self.enabled and (self.prof_all or op in self.prof_ops)

    def append(self, raw_name, record_name, latency, msg_size, group_size=None):
        algbw, busbw = calc_bw_log(raw_name, msg_size, latency, group_size)
        entry = self.comms_dict.setdefault(record_name, {}).setdefault(msg_size, [0, [], [], []])
        entry[0] += 1
        entry[1].append(latency)
        entry[2].append(algbw)
        entry[3].append(busbw)
        if self.verbose:
            log_dist(f"comm op: {record_name} | time (ms): {latency:.2f} | msg size: {convert_size(msg_size)} | "
                     f"algbw (Gbps): {algbw:.2f} | busbw (Gbps): {busbw:.2f}", [0])

    def collect_engine_records(self):
        """Moves the C++ dispatcher's records into this logger."""
        for op, size, group_size, ms in _C.comms_log_drain():
            if self.profiles(op):
                self.append(op, op, ms, size, group_size)

    def get_raw_data(self):
        self.collect_engine_records()
        return self.comms_dict.copy()

    def has_data(self):
        self.collect_engine_records()
        return bool(self.comms_dict)

    def reset_data(self):
        _C.comms_log_drain()
        self.comms_dict.clear()

    def get_operation_names(self):
        self.collect_engine_records()
        return list(self.comms_dict)

    def get_total_operations(self):
        self.collect_engine_records()
        return sum(v[0] for sizes in self.comms_dict.values() for v in sizes.values())

    def get_operation_summary(self, operation_name):
        self.collect_engine_records()
        if operation_name not in self.comms_dict:
            return None
        return {size: _summary(size, v) for size, v in self.comms_dict[operation_name].items()}

    def log_all(self, print_log=True, show_straggler=False, return_dict=False):
        """Prints the table (rank 0 of log_summary; here whoever calls) and
        returns DeepSpeed's dict when asked. show_straggler takes each
        record's fastest rank (a collective: every rank calls it)."""
        self.collect_engine_records()
        records = {name: dict(sorted(sizes.items())) for name, sizes in self.comms_dict.items()}
        result = {"summary": {}, "straggler_analysis": None, "metadata": {
            "world_size": dist.get_world_size() if dist.is_initialized() else 1,
            "rank": dist.get_rank() if dist.is_initialized() else 0,
            "timestamp": datetime.now().isoformat()}}
        columns = ("Comm. Op", "Message Size", "Count", "Total Latency(ms)", "Avg Latency(ms)", "tput_avg (Gbps)",
                   "busbw_avg (Gbps)")
        if print_log:
            print("".join(f"{c: <20}" for c in columns))
        for name, sizes in records.items():
            if print_log:
                print(name)
            result["summary"][name] = {}
            for size, v in sizes.items():
                s = _summary(size, v)
                result["summary"][name][size] = s
                if print_log:
                    print(" " * 20 + "".join(f"{x: <20}" for x in (
                        s["msg_size_str"], s["count"], f"{s['total_latency_ms']:.2f}", f"{s['avg_latency_ms']:.2f}",
                        f"{s['tput_avg_gbps']:.2f}", f"{s['busbw_avg_gbps']:.2f}")))
        if show_straggler:
            result["straggler_analysis"] = self._stragglers(records, print_log)
        return result if return_dict else None

    def _stragglers(self, records, print_log):
        """Per op and size: the latency of the fastest rank, summed, and how
        much longer this rank took. Every rank must hold the same records."""
        out = {}
        if print_log:
            print("_______________________________")
            print("Breakdown with straggler effect")
            print("-------------------------------")
            print("".join(f"{c: <20}" for c in ("Comm. Op", "Message Size", "Count", "Total comm lat(ms)",
                                               "Total straggler(ms)", "Avg comm lat(ms)", "Avg straggler(ms)")))
        # Engine collectives are logged as their handles complete, so a rank may
        # hold a record the others have not logged yet: compare only the (op,
        # size) pairs every rank holds as many of, or ranks would reduce apart.
        counts = {(name, size): v[0] for name, sizes in records.items() for size, v in sizes.items()}
        everyone = [counts]
        if dist.is_initialized():
            everyone = [None] * dist.get_world_size()
            dist.all_gather_object(everyone, counts)
        shared = {k for k in counts if all(c.get(k) == counts[k] for c in everyone)}
        device = _backend_device()
        for name in sorted(records):  # one order on every rank: each pair is a collective
            sizes = records[name]
            out[name] = {}
            if print_log:
                print(name)
            for size in sorted(sizes):
                v = sizes[size]
                if (name, size) not in shared:
                    continue
                mine = torch.tensor(v[1], dtype=torch.float64, device=device)
                fastest = mine.clone()
                if dist.is_initialized():
                    dist.all_reduce(fastest, op=dist.ReduceOp.MIN)
                straggler = mine - fastest
                fastest, straggler = fastest.cpu(), straggler.cpu()
                entry = {"count": v[0], "total_comm_lat_ms": fastest.sum().item(),
                         "total_straggler_ms": straggler.sum().item(),
                         "avg_comm_lat_ms": trim_mean(fastest.tolist(), 0.1),
                         "avg_straggler_ms": trim_mean(straggler.tolist(), 0.1),
                         "msg_size_bytes": size, "msg_size_str": convert_size(size)}
                out[name][size] = entry
                if print_log:
                    print(" " * 20 + "".join(f"{x: <20}" for x in (
                        entry["msg_size_str"], entry["count"], f"{entry['total_comm_lat_ms']:.2f}",
                        f"{entry['total_straggler_ms']:.2f}", f"{entry['avg_comm_lat_ms']:.2f}",
                        f"{entry['avg_straggler_ms']:.2f}")))
        return out


def _backend_device():
    """Where the default group reduces: the GPU for NCCL, the host otherwise."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _summary(size, v):
    count, latencies, algbws, busbws = v
    return {"count": count, "total_latency_ms": sum(latencies), "avg_latency_ms": trim_mean(latencies, 0.1),
            "tput_avg_gbps": trim_mean(algbws, 0.1), "busbw_avg_gbps": trim_mean(busbws, 0.1),
            "msg_size_bytes": size, "msg_size_str": convert_size(size)}


def caller_name(depth=2):
    """The function that called a zero_cpp.comm op (debug mode's record name)."""
    return sys._getframe(depth + 1).f_code.co_name


comms_logger = CommsLogger()  # the process's, as deepspeed.comm's
