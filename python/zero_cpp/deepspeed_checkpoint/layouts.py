"""How DeepSpeed lays a param's fp32 master and Adam moments out across its
ranks' files, and each param's full tensor read back from them.

- FlatGroups: ZeRO-1/2 (and its bf16 variant, BF16_Optimizer; with one
  "rank", the fused fp16 optimizer of stage 0). A param group is one flat
  buffer: its params one after another, each followed by its alignment
  padding, the whole padded to a multiple of the alignment and cut into
  equal partitions, partition r in rank r's file. Only trailing elements
  are padding, so the partitions put end to end read the params from the
  start whether or not a file kept its share of that padding.
- ParamPartitions: ZeRO-3. Each param is cut into world_size equal
  partitions of ceil(numel / world_size) (the last padded); rank r's flat
  buffer of a sub-group is its partition of each param, one after another.
- WholeParams: stage 0 (fp32, or the unfused fp16/bf16 optimizer): every
  param's tensors whole.

Each gives `read(name, kind)`: one param's full tensor, in fp32, copying
only that param's elements (the files are memory-mapped).
"""
import math

import torch

from .errors import DeepSpeedCheckpointError

KINDS = ("master", "exp_avg", "exp_avg_sq")


def _span(parts, begin, end):
    """Elements [begin, end) of the parts put end to end."""
    pieces, offset = [], 0
    for part in parts:
        lo, hi = max(begin, offset), min(end, offset + part.numel())
        if lo < hi:
            pieces.append(part.reshape(-1)[lo - offset:hi - offset])
        offset += part.numel()
    if not pieces:
        return torch.zeros(0)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def _numel(shape):
    return math.prod(int(d) for d in shape)


class FlatGroups:
    def __init__(self, what):
        self._what = what  # names the files in errors
        self._where = {}  # name -> (group, begin, shape)
        self._parts = []  # per group: {kind: [rank's tensor]}

    def add_group(self, params, parts):
        """params: (name, shape, padding after it) in the flat order; parts:
        {kind: each rank's 1-D share}, a kind with no state (no optimizer
        step yet) absent."""
        group, offset = len(self._parts), 0
        # The flat buffer is padded to a multiple of 2 x world_size elements
        # (DeepSpeed's nccl_start_alignment_factor): the masters hold less
        # than that beyond the params, or the params are not the ones held.
        alignment = 2 * len(parts["master"])
        for name, shape, padding in params:
            self._where[name] = (group, offset, shape)
            offset += _numel(shape) + padding
        for kind, shares in parts.items():
            held = sum(s.numel() for s in shares)
            # Moments may keep padding the masters drop (stage 1/2's non-elastic state).
            if held < offset or (kind == "master" and held - offset >= alignment):
                raise DeepSpeedCheckpointError(f"{self._what}: param group {group}'s {kind} partitions hold {held} "
                                               f"elements, its {len(params)} params {offset} (with their padding): "
                                               f"the params recorded for it are not the ones it holds")
        self._parts.append(parts)

    def read(self, name, kind):
        group, begin, shape = self._where[name]
        shares = self._parts[group].get(kind)
        if shares is None:
            return torch.zeros(_numel(shape))
        return _span(shares, begin, begin + _numel(shape)).float()


class ParamPartitions:
    def __init__(self, what, world_size):
        self._what, self._world = what, world_size
        self._where = {}  # name -> (sub-group, offset in each rank's flat, shape)
        self._flats = []  # per sub-group: {kind: [rank's flat]}

    def add_sub_group(self, params, flats):
        """params: (name, shape) in the flat order; flats: {kind: each rank's flat}."""
        sub, offset = len(self._flats), 0
        for name, shape in params:
            self._where[name] = (sub, offset, shape)
            offset += -(-_numel(shape) // self._world)
        for kind, per_rank in flats.items():
            sizes = {f.numel() for f in per_rank}
            if sizes != {offset}:
                raise DeepSpeedCheckpointError(f"{self._what}: sub-group {sub}'s {kind} holds {sorted(sizes)} "
                                               f"elements per rank, its {len(params)} params' partitions {offset}")
        self._flats.append(flats)

    def read(self, name, kind):
        sub, offset, shape = self._where[name]
        per_rank = self._flats[sub].get(kind)
        numel = _numel(shape)
        if per_rank is None:
            return torch.zeros(numel)
        share = -(-numel // self._world)
        return torch.cat([f.reshape(-1)[offset:offset + share] for f in per_rank])[:numel].float()


class WholeParams:
    def __init__(self):
        self._tensors = {}  # name -> {kind: tensor}

    def add(self, name, tensors):
        self._tensors[name] = tensors

    def read(self, name, kind):
        tensors = self._tensors[name]
        if kind not in tensors:
            return torch.zeros(tensors["master"].numel())
        return tensors[kind].reshape(-1).float()
