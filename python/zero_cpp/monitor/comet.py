"""DeepSpeed's Comet backend: rank 0 starts an experiment (`comet_ml.start`
with the block's api_key, project, workspace, experiment_key, mode, online;
`experiment_name` set on it) and logs an event only once
`samples_log_interval` samples have passed since that event's last log (its
first always). comet_ml >= 3.41.0, checked on every rank."""
from .monitor import Monitor, backend_config, is_writer

MIN_VERSION = "3.41.0"


def check_comet_availability():
    hint = 'ds_config: comet.enabled needs comet_ml >= 3.41.0: pip install "comet_ml>=3.41.0"'
    try:
        import comet_ml
    except ImportError:
        raise ImportError(hint) from None
    from packaging import version
    if version.parse(comet_ml.__version__) < version.Version(MIN_VERSION):
        raise ImportError(f"{hint} (this is {comet_ml.__version__})")


class EventsLogScheduler:
    """Whether an event is logged at `samples`: its first time, then each
    time `interval` samples have passed since it last was."""

    def __init__(self, interval):
        self.interval = interval
        self.last_logged = {}

    def needs_logging(self, name, samples):
        last = self.last_logged.get(name)
        if last is not None and samples - last < self.interval:
            return False
        self.last_logged[name] = samples
        return True


class CometMonitor(Monitor):

    def __init__(self, comet_config):
        comet_config = backend_config(comet_config, "comet")
        super().__init__(comet_config)
        self.enabled = bool(comet_config.enabled)
        self._samples_log_interval = comet_config.samples_log_interval
        self._experiment = None
        self._scheduler = EventsLogScheduler(comet_config.samples_log_interval)
        if self.enabled:
            check_comet_availability()
            if is_writer():
                import comet_ml
                self._experiment = comet_ml.start(api_key=comet_config.api_key, project=comet_config.project,
                                                  workspace=comet_config.workspace,
                                                  experiment_key=comet_config.experiment_key,
                                                  mode=comet_config.mode, online=comet_config.online)
                if comet_config.experiment_name is not None:
                    self._experiment.set_name(comet_config.experiment_name)

    @property
    def experiment(self):
        return self._experiment

    @property
    def samples_log_interval(self):
        return self._samples_log_interval

    def write_events(self, event_list):
        if self._experiment is None:
            return
        # The internal form is what DeepSpeed calls (no rate limit of its
        # own on top); the public log_metric where a client lacks it.
        log_metric = getattr(self._experiment, "__internal_api__log_metric__", None) or self._experiment.log_metric
        for name, value, samples in event_list:
            if self._scheduler.needs_logging(name, samples):
                log_metric(name=name, value=value, step=samples)
