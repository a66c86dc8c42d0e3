"""An independent safetensors reader (standard library + numpy) for the
checkpoint test: checks that a consolidated file and the checkpoint's
rank files, reassembled here from the manifest alone, hold the same fp32
values for every param. Usage: read_safetensors.py CKPT_TAG_DIR CONSOLIDATED"""
import json
import struct
import sys

import numpy as np


def read(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    data = blob[8 + n :]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        b, end = e["data_offsets"]
        out[name] = np.frombuffer(data[b:end], dtype="<f4").reshape(e["shape"])
    return out


if __name__ == "__main__":
    tag_dir, consolidated = sys.argv[1], sys.argv[2]
    manifest = json.load(open(f"{tag_dir}/manifest.json"))
    ranks = {int(r): read(f"{tag_dir}/{f['file']}") for r, f in manifest["files"].items()}
    full = read(consolidated)
    assert len(full) == len(manifest["params"]), (len(full), len(manifest["params"]))
    for p in manifest["params"]:
        flat = np.empty(p["numel"], dtype=np.float32)
        for rank, begin, end in p["fragments"]:
            flat[begin:end] = ranks[rank][p["name"] + "/master"]
        got = full[p["name"]]
        assert list(got.shape) == p["shape"], (p["name"], got.shape, p["shape"])
        assert np.array_equal(got.reshape(-1), flat), p["name"]
    print(f"ok: {len(full)} params, {sum(v.size for v in full.values())} values agree")
