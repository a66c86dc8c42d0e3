from ._holder import HyperparameterHolder


class FusedLamb(HyperparameterHolder):
    """DeepSpeed's FusedLamb."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, eps_inside_sqrt=False,
                 weight_decay=0.0, max_grad_norm=0.0, max_coeff=10.0, min_coeff=0.01, amsgrad=False):
        if amsgrad or eps_inside_sqrt:
            raise NotImplementedError("zero_cpp: FusedLamb(amsgrad or eps_inside_sqrt) is not supported")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, max_coeff=max_coeff,
                                      min_coeff=min_coeff))
