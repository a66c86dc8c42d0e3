"""DeepSpeed's CSV backend: one file per event, output_path/job_name/<event
with '/' and ' ' as '_'>.csv, "step,<the event's last path part>" first --
the layout the C++ engine's csv_monitor writes its own events in."""
import csv
import os

from .monitor import Monitor, backend_config, is_writer


class csvMonitor(Monitor):  # noqa: N801 (DeepSpeed's name)

    def __init__(self, csv_config):
        csv_config = backend_config(csv_config, "csv_monitor")
        super().__init__(csv_config)
        self.enabled = bool(csv_config.enabled)
        self.output_path = csv_config.output_path
        self.job_name = csv_config.job_name
        self.log_dir = os.path.join(self.output_path, self.job_name)
        self.filenames = []  # the files this process has begun (their header written)
        if self.enabled and is_writer():
            os.makedirs(self.log_dir, exist_ok=True)

    def write_events(self, event_list):
        if not (self.enabled and is_writer()):
            return
        for name, value, step in event_list:
            filename = name.replace("/", "_").replace(" ", "_")
            with open(os.path.join(self.log_dir, filename + ".csv"), "a", newline="") as f:
                out = csv.writer(f)
                if filename not in self.filenames:
                    self.filenames.append(filename)
                    out.writerow(["step", name.split("/")[-1]])
                out.writerow([step, _number(value)])


def _number(value):
    """A 0-d tensor (a loss) as its number, not its repr."""
    return value.item() if hasattr(value, "item") else value
