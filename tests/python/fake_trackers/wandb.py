"""A stand-in for the wandb client (not installed here, and it would talk to
a server): records each call the monitor makes, in `calls`, so a test holds
zero_cpp's calls to DeepSpeed's. Put on sys.path by the test alone."""
calls = []


def _number(value):
    return value.item() if hasattr(value, "item") else value


def init(**kwargs):
    calls.append(["init", kwargs])


def log(data, step=None, commit=None):
    calls.append(["log", {k: _number(v) for k, v in data.items()}, step, commit])
