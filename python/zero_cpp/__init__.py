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
import torch  # first: the extension links torch's libraries, which this loads

try:
    from . import _build_info  # written by `pip install .`: the torch it was built against
except ImportError:  # a build tree (./run build)
    _build_info = None
if _build_info is not None and _build_info.torch_version != torch.__version__:
    raise ImportError(f"zero_cpp was built against torch {_build_info.torch_version}, but torch "
                      f"{torch.__version__} is installed: reinstall zero-cpp (pip install .) against it")

from . import _C  # noqa: F401,E402
from . import deepspeed_alias  # noqa: E402

deepspeed_alias.install()  # `from deepspeed.X import Y` finds zero_cpp.X where DeepSpeed is not installed
from .version import __version__, __version_major__, __version_minor__, __version_patch__  # noqa: F401
from .distributed import init_distributed  # noqa: F401
from .config import DeepSpeedConfigError, add_config_arguments  # noqa: F401
from .engine import ZeroEngine, ZeroDataLoader, initialize  # noqa: F401
from . import accelerator, checkpointing, comm, moe, ops, runtime, utils, zero  # noqa: F401
from .accelerator import get_accelerator  # noqa: F401
from .utils import log_dist, logger  # noqa: F401
from .runtime.config import DeepSpeedConfig  # noqa: F401,E402  (deepspeed.DeepSpeedConfig)
from . import inference  # noqa: F401,E402
from .inference import (DeepSpeedInferenceConfig, InferenceEngine, default_inference_config,  # noqa: F401,E402
                        init_inference)
from .utils import OnDevice  # noqa: F401,E402
from . import comm as dist  # noqa: E402  (deepspeed.dist)

TORCH_DISTRIBUTED_DEFAULT_PORT = 29500  # DeepSpeed's (deepspeed.constants)

DeepSpeedEngine = ZeroEngine
DeepSpeedDataLoader = ZeroDataLoader
