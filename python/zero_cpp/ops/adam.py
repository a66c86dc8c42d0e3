from ._holder import HyperparameterHolder


class FusedAdam(HyperparameterHolder):
    """DeepSpeed's FusedAdam: AdamW (decoupled weight decay) unless adam_w_mode=False."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True,
                 weight_decay=0.0, amsgrad=False, set_grad_none=True):
        if amsgrad:
            raise NotImplementedError("zero_cpp: FusedAdam(amsgrad=True) is not supported")
        if not bias_correction:
            raise NotImplementedError("zero_cpp: FusedAdam(bias_correction=False) is not supported")
        self.adam_w_mode = adam_w_mode
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, adam_w_mode=adam_w_mode))


class DeepSpeedCPUAdam(FusedAdam):
    """DeepSpeed's CPU Adam (ZeRO-Offload's): the same update."""

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, adamw_mode=True, fp32_optimizer_states=True):
        super().__init__(model_params, lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                         adam_w_mode=adamw_mode, weight_decay=weight_decay, amsgrad=amsgrad)
