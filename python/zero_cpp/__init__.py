"""zero_cpp: DeepSpeed's ZeRO API over zero-cpp's C++ engine.

    import zero_cpp as deepspeed      # the one changed line
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                    config="ds_config.json")
    for batch in loader:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()

Launch with `zero-run -n N -- python train.py`, torchrun, DeepSpeed's
launcher, srun or mpirun. What is supported and what is not:
docs/from-deepspeed.md.
"""
import torch  # noqa: F401  (first: the extension links torch's libraries, which this loads)

from . import _C  # noqa: F401
from .version import __version__, __version_major__, __version_minor__, __version_patch__  # noqa: F401
from .distributed import init_distributed  # noqa: F401
from .config import DeepSpeedConfigError, add_config_arguments  # noqa: F401
from .engine import ZeroEngine, ZeroDataLoader, initialize  # noqa: F401
from . import checkpointing, comm, ops, utils, zero  # noqa: F401

DeepSpeedEngine = ZeroEngine
DeepSpeedDataLoader = ZeroDataLoader
