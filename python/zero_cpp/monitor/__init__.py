"""DeepSpeed's `deepspeed.monitor`: training events written to TensorBoard
and CSV files, by the engine (engine.monitor) and by scripts
(`MonitorMaster(DeepSpeedConfig(path).monitor_config).write_events(...)`)."""
from . import csv_monitor, monitor, tensorboard  # noqa: F401
from .monitor import Monitor, MonitorMaster  # noqa: F401
