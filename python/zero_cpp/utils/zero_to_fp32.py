"""DeepSpeed's zero_to_fp32, for zero_cpp's checkpoints (sharded at any
world size and stage, from either front end): the whole model's fp32
weights by name, with no engine and no ranks. The reading is the C++
library's (the checkpoint's manifest and hashes checked, as `zero-ckpt
consolidate` does).

    python -m zero_cpp.utils.zero_to_fp32 CHECKPOINT_DIR OUT [--tag TAG] [--safe_serialization]
"""
import argparse
import os

import torch

from .. import _C


def _aliases(client_state_json):
    from ..engine import _unpack_client_state
    try:
        _, own = _unpack_client_state(client_state_json)
    except (ValueError, AttributeError):
        return {}
    return own.get("aliases", {}) if own else {}


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag=None, exclude_frozen_parameters=False,
                                             lazy_mode=False):
    """{name: fp32 tensor} for every trainable param (tied weights under each
    of their names), and the frozen params and buffers as they were saved
    (unless exclude_frozen_parameters)."""
    c = _C.read_checkpoint(os.fspath(checkpoint_dir), tag or "")
    sd = dict(c["params"])
    for alias, name in _aliases(c["client_state"]).items():
        if name in sd and alias not in sd:
            sd[alias] = sd[name]
    if not exclude_frozen_parameters:
        sd.update(c["replicated"])
    return sd


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, max_shard_size="5GB",
                                               safe_serialization=False, tag=None,
                                               exclude_frozen_parameters=False):
    """Writes the fp32 state dict into output_dir: model.safetensors with
    safe_serialization (the C++ consolidation, one file), else
    pytorch_model.bin (torch.save)."""
    os.makedirs(output_dir, exist_ok=True)
    if safe_serialization:
        out = os.path.join(output_dir, "model.safetensors")
        _C.consolidate(os.fspath(checkpoint_dir), _C.resolve_tag(os.fspath(checkpoint_dir), tag or ""), out, "fp32")
        return out
    out = os.path.join(output_dir, "pytorch_model.bin")
    torch.save(get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters), out)
    return out


def load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag=None):
    """Loads the checkpoint's fp32 weights into a plain (unsharded) model."""
    model.load_state_dict(get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag), strict=False)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint_dir")
    ap.add_argument("output_dir")
    ap.add_argument("-t", "--tag", default=None)
    ap.add_argument("--safe_serialization", action="store_true")
    ap.add_argument("--exclude_frozen_parameters", action="store_true")
    a = ap.parse_args()
    print(convert_zero_checkpoint_to_fp32_state_dict(a.checkpoint_dir, a.output_dir, safe_serialization=a.safe_serialization,
                                                     tag=a.tag, exclude_frozen_parameters=a.exclude_frozen_parameters))


if __name__ == "__main__":
    main()
