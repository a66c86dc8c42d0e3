"""A stand-in for the comet_ml client (not installed here, and it would talk
to a server): records each call the monitor makes, in `calls`, so a test
holds zero_cpp's calls to DeepSpeed's. Put on sys.path by the test alone."""
__version__ = "3.49.0"  # DeepSpeed's monitor asks for >= 3.41.0

calls = []


def _number(value):
    return value.item() if hasattr(value, "item") else value


class Experiment:

    def set_name(self, name):
        calls.append(["set_name", name])

    def log_metric(self, name, value, step=None, **kwargs):
        calls.append(["log_metric", name, _number(value), step])

    # What DeepSpeed's monitor calls (comet_ml's internal form of log_metric).
    __internal_api__log_metric__ = log_metric


def start(**kwargs):
    calls.append(["start", kwargs])
    return Experiment()
