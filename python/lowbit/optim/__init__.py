"""lowbit.optim: torch.optim optimizers whose state is blockwise-quantized (optimizers.py), gradient release
(gradient_release.py), and the raw step op's argument builder (step_args.py) they are built on."""
from .gradient_release import GradientRelease
from .optimizer import LowbitOptimizer
from .optimizers import LAMB, SGD, AdEMAMix, Adagrad, Adam, AdamW, Lion, RMSprop
from .step_args import ParamState, hyper_parameters, init_state, step

__all__ = ["Adam", "AdamW", "SGD", "Lion", "RMSprop", "Adagrad", "AdEMAMix", "LAMB", "LowbitOptimizer",
           "GradientRelease", "ParamState", "hyper_parameters", "init_state", "step"]
