"""DeepSpeed's `deepspeed.runtime.utils.see_memory_usage`: one line of
this process's memory, on rank 0, where a script asks for it."""
import gc
import logging

import torch.distributed as dist

from ..accelerator import get_accelerator, host_rss_bytes
from ..utils.logging import logger


def see_memory_usage(message, force=False, ranks=(0,)):
    """Logs the accelerator's allocated and reserved bytes (now and peak)
    and the host's RSS, on rank 0 only; nothing unless `force`, as
    DeepSpeed's (which a script turns on where it wants the line)."""
    if not force:
        return
    if dist.is_initialized() and dist.get_rank() not in ranks:
        return
    gc.collect()
    acc = get_accelerator()
    gib = 2**30
    rss = host_rss_bytes()
    logger.log(logging.INFO, f"{message} | {acc.device_name()} allocated {acc.memory_allocated() / gib:.2f} GiB "
               f"(peak {acc.max_memory_allocated() / gib:.2f}), reserved {acc.memory_reserved() / gib:.2f} GiB "
               f"(peak {acc.max_memory_reserved() / gib:.2f}) | host RSS {rss / gib:.2f} GiB")
    acc.reset_peak_memory_stats()
