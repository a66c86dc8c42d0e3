"""The C++ tools installed with the package (`pip install .` puts them in
zero_cpp/bin): zero-run, the launcher, and zero-ckpt (inspect, verify,
consolidate checkpoints). Console scripts run them."""
import os
import sys


def _exec(name):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", name)
    if not os.path.exists(path):
        sys.exit(f"zero_cpp: {path} is missing (this zero_cpp was not installed by pip; use the build's {name})")
    os.execv(path, [name] + sys.argv[1:])


def zero_run():
    _exec("zero-run")


def zero_ckpt():
    _exec("zero-ckpt")
