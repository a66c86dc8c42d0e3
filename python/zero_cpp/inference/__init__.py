"""DeepSpeed's `deepspeed.inference`: `init_inference` and its engine and config."""
from .config import DeepSpeedInferenceConfig, merge
from .engine import InferenceEngine


def init_inference(model, config=None, **kwargs):
    """`deepspeed.init_inference(model, config=None, **kwargs)`: the model
    wrapped for inference. `config` is a dict or a JSON file's path;
    keyword arguments are keys of the same config, over it."""
    return InferenceEngine(model, config=DeepSpeedInferenceConfig(**merge(config, kwargs)))


def default_inference_config():
    """DeepSpeed's inference config's defaults, as a dict."""
    return DeepSpeedInferenceConfig().dict()
