from ._holder import HyperparameterHolder


class DeepSpeedCPUAdagrad(HyperparameterHolder):
    """DeepSpeed's CPU Adagrad."""

    def __init__(self, model_params, lr=1e-2, eps=1e-10, weight_decay=0, amsgrad=False, fp32_optimizer_states=True):
        super().__init__(model_params, dict(lr=lr, eps=eps, weight_decay=weight_decay))
