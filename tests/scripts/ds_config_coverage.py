"""Checks tests/data/ds_configs/ok/deepspeed_<version>_defaults.json against an
installed DeepSpeed: DeepSpeed must accept the file, and every key DeepSpeed
reads (top-level keys its config reader looks up, and the fields of its
ZeRO, offload and fp16/bf16 models) must be in it. The unit test
DsConfigs.DeepSpeedDefaultsAreAccepted checks that zero-cpp accepts the same
file, so together they show which DeepSpeed keys zero-cpp knows.

    $TORCH_ENV/bin/python tests/scripts/ds_config_coverage.py
(`./run bench` installs DeepSpeed into that environment.) Exit 1 lists what is missing."""
import json
import logging
import pathlib
import sys

logging.disable(logging.CRITICAL)
import deepspeed  # noqa: E402
from deepspeed.runtime.config import _REMOVED_TOP_LEVEL_CONFIG_KEYS, DeepSpeedConfig  # noqa: E402
from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config  # noqa: E402
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig  # noqa: E402
from deepspeed.runtime.zero.offload_config import (  # noqa: E402
    DeepSpeedZeroOffloadOptimizerConfig, DeepSpeedZeroOffloadParamConfig)

path = pathlib.Path(__file__).parents[1] / "data/ds_configs/ok" / f"deepspeed_{deepspeed.__version__}_defaults.json"
config = json.loads(path.read_text())


class Recording(dict):
    """A dict that records which keys DeepSpeed's config reader asks for."""
    asked = set()

    def __init__(self, d, prefix=""):
        super().__init__(d)
        self.prefix = prefix

    def _ask(self, key):
        Recording.asked.add(self.prefix + key)

    def __getitem__(self, key):
        self._ask(key)
        value = super().__getitem__(key)
        return Recording(value, f"{self.prefix}{key}.") if type(value) is dict else value

    def get(self, key, default=None):
        self._ask(key)
        return self[key] if super().__contains__(key) else default

    def __contains__(self, key):
        self._ask(key)
        return super().__contains__(key)


DeepSpeedConfig(Recording(config))  # raises if DeepSpeed refuses the file

# Keys of removed features are looked up only to be refused (zero-cpp still
# accepts them disabled, so older configs load).
wanted = {k for k in Recording.asked if "." not in k and k not in _REMOVED_TOP_LEVEL_CONFIG_KEYS}
# Any two batch keys give the third; the file gives two so it fits any data-parallel size.
wanted.discard("train_batch_size")
for model, prefix in [(DeepSpeedZeroConfig, "zero_optimization."),
                      (DeepSpeedZeroOffloadOptimizerConfig, "zero_optimization.offload_optimizer."),
                      (DeepSpeedZeroOffloadParamConfig, "zero_optimization.offload_param."),
                      (DeepSpeedFP16Config, "fp16."), (DeepSpeedBF16Config, "bf16.")]:
    for name, field in model.model_fields.items():
        extra = field.json_schema_extra or {}
        if field.exclude or extra.get("deprecated") or name == "leaf_module":
            continue  # deprecated spellings are tested on their own; leaf_module names Python classes
        wanted.add(prefix + (field.alias or name))


def present(dotted):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


missing = sorted(k for k in wanted if not present(k))
print(json.dumps({"deepspeed": deepspeed.__version__, "file": str(path), "keys_checked": len(wanted),
                  "missing": missing}))
sys.exit(1 if missing else 0)
