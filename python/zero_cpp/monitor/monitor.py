"""The monitor every backend shares, and MonitorMaster, which writes each
event to every backend the config enables. Only rank 0 writes, as
DeepSpeed's; the other ranks' calls do nothing."""
import torch.distributed as dist


def is_writer():
    return not dist.is_initialized() or dist.get_rank() == 0


def backend_config(config, name):
    """A backend's own block, from it or from the monitor_config holding it
    (DeepSpeed's tutorial passes the latter to a single backend)."""
    return getattr(config, name, config)


class Monitor:
    """A backend: `write_events([(name, value, step), ...])`."""

    def __init__(self, monitor_config):
        self.monitor_config = monitor_config

    def write_events(self, event_list):
        raise NotImplementedError


class MonitorMaster(Monitor):
    """Every backend `monitor_config` enables (TensorBoard, WandB, CSV
    files, Comet), written in DeepSpeed's order."""

    def __init__(self, monitor_config):
        super().__init__(monitor_config)
        from .comet import CometMonitor
        from .csv_monitor import csvMonitor
        from .tensorboard import TensorBoardMonitor
        from .wandb import WandbMonitor
        self.enabled = bool(monitor_config.enabled)

        def backend(cls, config):
            return cls(config) if config.enabled else None
        self.tb_monitor = backend(TensorBoardMonitor, monitor_config.tensorboard)
        self.wandb_monitor = backend(WandbMonitor, monitor_config.wandb)
        self.csv_monitor = backend(csvMonitor, monitor_config.csv_monitor)
        self.comet_monitor = backend(CometMonitor, monitor_config.comet)

    def write_events(self, event_list):
        for backend in (self.tb_monitor, self.wandb_monitor, self.csv_monitor, self.comet_monitor):
            if backend is not None:
                backend.write_events(event_list)


_BACKENDS = {"TensorBoardMonitor": "tensorboard", "WandbMonitor": "wandb", "csvMonitor": "csv_monitor",
             "CometMonitor": "comet"}


def __getattr__(name):
    """The backends under DeepSpeed's `deepspeed.monitor.monitor` names,
    imported when asked for (as MonitorMaster imports them)."""
    if name in _BACKENDS:
        import importlib
        return getattr(importlib.import_module(f"{__package__}.{_BACKENDS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
