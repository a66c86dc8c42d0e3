"""DeepSpeed's WandB backend: rank 0 starts a run (`wandb.init(project,
group, entity=team)`) and logs each event as `wandb.log({name: value},
step=samples)`. The client is checked on every rank, so a missing package is
named on each, not only on rank 0 while the others wait."""
from .monitor import Monitor, backend_config, is_writer


def check_wandb_availability():
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ImportError("ds_config: wandb.enabled needs the wandb package: pip install wandb "
                          "(and `wandb login`, or WANDB_MODE=offline)") from None


class WandbMonitor(Monitor):

    def __init__(self, wandb_config):
        wandb_config = backend_config(wandb_config, "wandb")
        super().__init__(wandb_config)
        self.enabled = bool(wandb_config.enabled)
        self.group = wandb_config.group
        self.team = wandb_config.team
        self.project = wandb_config.project
        if self.enabled:
            check_wandb_availability()
            if is_writer():
                import wandb
                wandb.init(project=self.project, group=self.group, entity=self.team)

    def log(self, data, step=None, commit=None):
        """`wandb.log` on rank 0 (DeepSpeed's `engine.monitor.wandb_monitor.log`)."""
        if self.enabled and is_writer():
            import wandb
            return wandb.log(data, step=step, commit=commit)
        return None

    def write_events(self, event_list):
        for name, value, step in event_list:
            self.log({name: value}, step=step)
