"""Quantized state that overflows to Inf/NaN is reported as the C++ optimizers report it (tests/test_optim.cpp,
OptimOp.StateOverflowIsReportedWithTheParameter): an error naming the parameter, its group and shape, the blocks
lost and the step, once per overflow; CPU parameters after every step, and check_overflow() on demand."""
import pytest
import torch

import lowbit

O = lowbit.optim


def overflowing_step(state_format):
    """Adagrad's sum of g^2 with g = 1e20 (finite, its square not) in parameter 1 of group 0."""
    torch.manual_seed(0)
    p = [torch.randn(5000, requires_grad=True), torch.randn(8192, requires_grad=True)]
    opt = O.Adagrad(p, lr=0.1, state_format=state_format)
    p[0].grad = torch.randn(5000)
    p[1].grad = torch.randn(8192)
    p[1].grad[300] = 1e20
    return opt, p


@pytest.mark.parametrize("state_format", ["Q8", "Q4", "FP8", "C8"])
def test_an_overflowed_state_names_the_parameter_once(state_format):
    opt, p = overflowing_step(state_format)
    with pytest.raises(RuntimeError, match=r"lowbit.optim.Adagrad: the state of parameter 1 of group 0 \(shape \[8192\]\) "
                                           r"overflowed to Inf/NaN in 1 block\(s\) at step 1"):
        opt.step()
    opt.check_overflow()  # reported once
    # A well-behaved step reports nothing.
    q = [torch.randn(8192, requires_grad=True)]
    ok = O.Adagrad(q, lr=0.1, state_format=state_format)
    q[0].grad = torch.randn(8192)
    ok.step()
    ok.check_overflow()


def test_the_check_on_demand_and_a_loaded_state_reports_nothing_twice():
    opt, p = overflowing_step("Q8")
    opt.set_overflow_check_interval(3)
    with pytest.raises(RuntimeError, match="overflowed to Inf/NaN"):
        opt.step()
    sd = opt.state_dict()
    again = O.Adagrad(p, lr=0.1, state_format="Q8")
    again.load_state_dict(sd)
    again.check_overflow()  # the saving run's overflow is not reported again
    with pytest.raises(ValueError, match=r"set_overflow_check_interval: n must be an int >= 0 .*got -1"):
        opt.set_overflow_check_interval(-1)
