"""DeepSpeed's TensorBoard backend: torch's SummaryWriter (which needs the
`tensorboard` package) writing scalars into output_path/job_name."""
import os

from .monitor import Monitor, backend_config, is_writer


class TensorBoardMonitor(Monitor):

    def __init__(self, tensorboard_config):
        tensorboard_config = backend_config(tensorboard_config, "tensorboard")
        super().__init__(tensorboard_config)
        self.enabled = bool(tensorboard_config.enabled)
        self.output_path = tensorboard_config.output_path
        self.job_name = tensorboard_config.job_name
        self.summary_writer = None
        if self.enabled and is_writer():
            try:
                import tensorboard  # noqa: F401  (torch's writer needs it; its import error names less)
            except ImportError:
                raise ImportError("ds_config: tensorboard.enabled needs the tensorboard package: "
                                  "pip install tensorboard") from None
            from torch.utils.tensorboard import SummaryWriter
            log_dir = os.path.join(self.output_path, self.job_name)
            os.makedirs(log_dir, exist_ok=True)
            self.summary_writer = SummaryWriter(log_dir=log_dir)

    def write_events(self, event_list, flush=True):
        if self.summary_writer is None:
            return
        for name, value, step in event_list:
            self.summary_writer.add_scalar(name, value, step)
        if flush:
            self.summary_writer.flush()

    def flush(self):
        if self.summary_writer is not None:
            self.summary_writer.flush()
