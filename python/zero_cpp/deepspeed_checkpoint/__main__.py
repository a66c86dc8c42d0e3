"""python -m zero_cpp.deepspeed_checkpoint DS_DIR OUT_DIR [--tag TAG] [--out-tag TAG]:
a checkpoint DeepSpeed saved, rewritten as a zero-cpp checkpoint that the C++
engine (engine.load_checkpoint, zero-train --load) and the Python front end
load at any world size and stage. One process; DeepSpeed need not be
installed."""
import argparse
import os
import sys

from . import DeepSpeedCheckpointError, convert_deepspeed_checkpoint
from .reader import tag_path


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m zero_cpp.deepspeed_checkpoint",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("ds_dir", help="the directory DeepSpeed's save_checkpoint wrote")
    parser.add_argument("out_dir", help="where the zero-cpp checkpoint goes")
    parser.add_argument("--tag", default=None, help="DeepSpeed's tag (default: the one its `latest` names)")
    parser.add_argument("--out-tag", default=None, help="the zero-cpp tag (default: DeepSpeed's)")
    args = parser.parse_args(argv)
    try:
        tag = os.path.basename(tag_path(args.ds_dir, args.tag))
        convert_deepspeed_checkpoint(args.ds_dir, tag, args.out_dir, args.out_tag or tag)
    except DeepSpeedCheckpointError as e:
        sys.exit(f"error: {e}")
    print(f"{args.ds_dir}/{tag} -> {args.out_dir}/{args.out_tag or tag}")


if __name__ == "__main__":
    main()
