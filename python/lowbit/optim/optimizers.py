"""The optimizers: torch.optim's argument names and defaults (lowbit's C++ Options for Lion, AdEMAMix and LAMB,
which torch has not), plus lowbit's options (state_format, block_size, min_quant_numel, bf16_stochastic_round,
max_grad_norm, skip_nonfinite, fp8_second_moment, master_weight_bits; optimizer.py COMMON_DEFAULTS).

Each class maps its options onto the op's named hyper-parameters as the C++ optimizer's config() does
(optim/optimizers.cpp); their ranges are the op's to check.
"""
from .optimizer import LowbitOptimizer

ADAM_STATE = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")


class Adam(LowbitOptimizer):
    rule = "Adam"
    state_names = ADAM_STATE

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 maximize=False, **options):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize), options)

    def op_hyper_parameters(self, g):
        return dict(beta1=g["betas"][0], beta2=g["betas"][1], eps=g["eps"], weight_decay=g["weight_decay"],
                    amsgrad=g["amsgrad"], maximize=g["maximize"])


class AdamW(Adam):
    rule = "AdamW"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, **options):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize, **options)


class SGD(LowbitOptimizer):
    rule = "SGD"
    state_names = ("momentum_buffer",)

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False, **options):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize), options)

    def op_hyper_parameters(self, g):
        return dict(momentum=g["momentum"], dampening=g["dampening"], weight_decay=g["weight_decay"],
                    nesterov=g["nesterov"], maximize=g["maximize"])


class Lion(LowbitOptimizer):
    """Lion (Chen et al., arXiv 2302.06675), the defaults of the paper's reference implementation."""
    rule = "Lion"
    state_names = ("exp_avg",)

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, *, maximize=False, **options):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), weight_decay=weight_decay, maximize=maximize),
                         options)

    def op_hyper_parameters(self, g):
        # eps 0: what the C++ Lion passes (the rule reads none).
        return dict(beta1=g["betas"][0], beta2=g["betas"][1], eps=0.0, weight_decay=g["weight_decay"],
                    maximize=g["maximize"])


class RMSprop(LowbitOptimizer):
    rule = "RMSprop"
    state_names = ("square_avg", "momentum_buffer", "grad_avg")

    def __init__(self, params, lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False, *,
                 maximize=False, **options):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum,
                                      centered=centered, maximize=maximize), options)

    def op_hyper_parameters(self, g):
        return dict(alpha=g["alpha"], eps=g["eps"], weight_decay=g["weight_decay"], momentum=g["momentum"],
                    centered=g["centered"], maximize=g["maximize"])


class Adagrad(LowbitOptimizer):
    rule = "Adagrad"
    state_names = ("sum",)

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10,
                 *, maximize=False, **options):
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value, eps=eps,
                                      maximize=maximize), options)

    def op_hyper_parameters(self, g):
        return dict(eps=g["eps"], weight_decay=g["weight_decay"], lr_decay=g["lr_decay"], maximize=g["maximize"])

    def initial_state_value(self, g):
        return float(g["initial_accumulator_value"])


class AdEMAMix(LowbitOptimizer):
    """AdEMAMix (Pagliardini et al., arXiv 2409.03137): betas (beta1, beta2, beta3) and alpha, which warm up over
    t_alpha_beta3 steps when it is > 0."""
    rule = "AdEMAMix"
    state_names = ("exp_avg_fast", "exp_avg_slow", "exp_avg_sq")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999, 0.9999), alpha=5.0, t_alpha_beta3=0, eps=1e-8,
                 weight_decay=0.0, *, maximize=False, **options):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), alpha=alpha, t_alpha_beta3=t_alpha_beta3, eps=eps,
                                      weight_decay=weight_decay, maximize=maximize), options)

    def op_hyper_parameters(self, g):
        b1, b2, b3 = g["betas"]
        return dict(beta1=b1, beta2=b2, beta3=b3, alpha=g["alpha"], t_alpha_beta3=g["t_alpha_beta3"], eps=g["eps"],
                    weight_decay=g["weight_decay"], maximize=g["maximize"])


class LAMB(LowbitOptimizer):
    """LAMB (You et al., arXiv 1904.00962): Adam's direction plus decoupled weight decay, scaled per parameter by
    the trust ratio ||p|| / ||r||."""
    rule = "LAMB"
    state_names = ADAM_STATE

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, *, maximize=False,
                 **options):
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      maximize=maximize), options)

    def op_hyper_parameters(self, g):
        return dict(beta1=g["betas"][0], beta2=g["betas"][1], eps=g["eps"], weight_decay=g["weight_decay"],
                    maximize=g["maximize"])


ALL = (Adam, AdamW, SGD, Lion, RMSprop, Adagrad, AdEMAMix, LAMB)
