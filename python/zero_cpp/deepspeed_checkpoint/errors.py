"""The error a conversion raises for a DeepSpeed checkpoint it cannot
convert: the path, what it holds and why zero-cpp cannot take it."""


class DeepSpeedCheckpointError(ValueError):
    pass
