"""A checkpoint in zero-cpp's layout (docs/checkpoints.md), written from
Python as the C++ engine's save writes one, for its loader to read at any
world size and stage: TAG/rank_0.safetensors holds every param whole
(`<name>/<kind>`, fp32) and every frozen param and buffer
(`<name>/value`); TAG/manifest.json says so, with each file's size and
content hash and its own hash; `latest` names TAG.

Published as the engine publishes a save: written into .partial-TAG
(which the loader skips, warning), fsynced, renamed into place, then
`latest` replaced by a rename; an earlier conversion into the same tag is
moved aside first and removed after.
"""
import json
import math
import os
import shutil
import struct

import torch

from .. import _C

FORMAT_VERSION = 2  # src/ckpt/manifest.h kFormatVersion: the version that carries manifest_hash
_RANK_FILE = "rank_0.safetensors"

# Floating-point tensors are stored at least in fp32 (a 16-bit one widened,
# exactly), as the engine stores frozen params and buffers.
_SAFETENSORS_DTYPES = {
    torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
    torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
}


def _stored(t):
    """A tensor as the checkpoint stores it: 16-bit floats widened to fp32."""
    return t.float() if t.is_floating_point() and t.element_size() < 4 else t


class Param:
    """A trainable param: `read(kind)` gives its full fp32 state of that kind
    (master, exp_avg, exp_avg_sq), called once per kind when it is written."""

    def __init__(self, name, shape, read):
        self.name, self.shape, self.read = name, [int(d) for d in shape], read
        self.numel = math.prod(self.shape)


def write_checkpoint(out_dir, tag, fields, kinds, params, replicated):
    """Writes out_dir/tag and points out_dir/latest at it. `fields`: the
    manifest's other entries (world_size, stage, config, engine_state, ...);
    `params`: Params; `replicated`: (name, "param" | "buffer", tensor) for
    frozen params and buffers."""
    if not tag or "/" in tag or tag.startswith(".") or tag == "latest":
        raise ValueError(f"checkpoint tag {tag!r} must be a plain name (no '/', not 'latest')")
    os.makedirs(out_dir, exist_ok=True)
    partial = os.path.join(out_dir, f".partial-{tag}")
    shutil.rmtree(partial, ignore_errors=True)  # what a conversion that died left
    os.makedirs(partial)
    try:
        values = [(name, kind, _stored(t.detach().cpu())) for name, kind, t in replicated]
        for name, _, t in values:
            if t.dtype not in _SAFETENSORS_DTYPES:
                raise ValueError(f"{name} is {t.dtype}, which zero-cpp checkpoints do not store")
        size, digest = _write_rank_file(os.path.join(partial, _RANK_FILE), kinds, params, values)
        manifest = dict(fields, format="zero-cpp checkpoint", format_version=FORMAT_VERSION, tag=tag, kinds=kinds,
                        params=[{"name": p.name, "shape": p.shape, "numel": p.numel, "fragments": [[0, 0, p.numel]]}
                                for p in params],
                        replicated=[{"name": name, "kind": kind, "dtype": _SAFETENSORS_DTYPES[t.dtype],
                                     "shape": list(t.shape)} for name, kind, t in values],
                        files={"0": {"file": _RANK_FILE, "bytes": size, "hash": str(digest)}})
        # The C++ loader's own hash (over its canonical dump of the JSON), so the two cannot drift apart.
        manifest["manifest_hash"] = _C.checkpoint_manifest_hash(json.dumps(manifest, allow_nan=False))
        _write_synced(os.path.join(partial, "manifest.json"),
                      json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n")
        _fsync_dir(partial)
        _publish(out_dir, tag, partial)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _write_rank_file(path, kinds, params, values):
    """The safetensors file, its header from names and shapes alone, then
    each tensor as it is read: one param's state in memory at a time."""
    entries, offset = [], 0

    def add(name, dtype, shape, nbytes):
        nonlocal offset
        entries.append((name, {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}))
        offset += nbytes

    for kind in kinds:
        for p in params:
            add(f"{p.name}/{kind}", "F32", [p.numel], 4 * p.numel)
    for name, _, t in values:
        add(f"{name}/value", _SAFETENSORS_DTYPES[t.dtype], list(t.shape), t.numel() * t.element_size())
    header = json.dumps(dict(entries), separators=(",", ":")).encode("utf-8")
    header += b" " * (-len(header) % 8)  # the data starts 8-byte aligned, as the engine's files do
    with open(path, "wb") as f:
        put = f.write
        put(struct.pack("<Q", len(header)) + header)
        for kind in kinds:
            for p in params:
                t = p.read(kind)
                if t.dtype != torch.float32 or t.numel() != p.numel:
                    raise ValueError(f"{p.name}'s {kind} is {t.dtype} of {t.numel()} elements, not fp32 of {p.numel}")
                put(_bytes(t))
        for _, _, t in values:
            put(_bytes(t))
        f.flush()
        os.fsync(f.fileno())
    # The loader's hash of the file, read back by the C++ reader it checks with.
    size, digest = _C.checkpoint_file_digest(path)
    assert size == 8 + len(header) + offset, (path, size)
    return size, digest


def _bytes(t):
    # Little-endian, as the engine's files: the hosts torch runs on are.
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data


def _write_synced(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(out_dir, tag, partial):
    final = os.path.join(out_dir, tag)
    stale = os.path.join(out_dir, f".replaced-{tag}")
    if os.path.exists(final):
        shutil.rmtree(stale, ignore_errors=True)
        os.rename(final, stale)
    os.rename(partial, final)
    _fsync_dir(out_dir)
    shutil.rmtree(stale, ignore_errors=True)
    latest = os.path.join(out_dir, "latest")
    _write_synced(latest + ".tmp", tag + "\n")
    os.replace(latest + ".tmp", latest)
    _fsync_dir(out_dir)
