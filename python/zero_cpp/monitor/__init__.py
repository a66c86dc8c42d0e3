"""DeepSpeed's `deepspeed.monitor`: training events written to TensorBoard,
WandB, CSV files and Comet, by the engine (engine.monitor) and by scripts
(`MonitorMaster(DeepSpeedConfig(path).monitor_config).write_events(...)`)."""
from . import comet, csv_monitor, monitor, tensorboard, wandb  # noqa: F401
from .monitor import Monitor, MonitorMaster  # noqa: F401
