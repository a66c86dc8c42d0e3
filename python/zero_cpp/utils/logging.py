"""DeepSpeed's `deepspeed.utils.logger` and `log_dist`: one logger for the
package, printing on stdout at INFO and up (its level set like any
logging.Logger), and a helper that logs on chosen ranks only."""
import logging
import sys

import torch.distributed as dist


def _make_logger():
    log = logging.getLogger("zero_cpp")
    if not log.handlers:  # once, however often this module is imported
        handler = logging.StreamHandler(stream=sys.stdout)
        handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


logger = _make_logger()


def _rank():
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else -1


def log_dist(message, ranks=None, level=logging.INFO):
    """Log `message` prefixed by this rank on the ranks in `ranks` (every
    rank when it starts with -1; every process before torch.distributed is
    set up; no rank when it is None or empty, as DeepSpeed's)."""
    rank = _rank()
    ranks = list(ranks or [])
    if rank == -1 or (ranks and ranks[0] == -1) or rank in ranks:
        logger.log(level, f"[Rank {rank}] {message}", stacklevel=2)


_logged_once = set()


def log_dist_once(message, ranks=None, level=logging.INFO):
    """log_dist, once per distinct message and level in this process."""
    if (message, level) not in _logged_once:
        _logged_once.add((message, level))
        log_dist(message, ranks, level)


def set_log_level_from_string(name, logger=logger):
    level = logging.getLevelName(name.upper())
    if not isinstance(level, int):
        raise ValueError(f"set_log_level_from_string: {name!r} is not a logging level (debug, info, warning, "
                         "error, critical)")
    logger.setLevel(level)
