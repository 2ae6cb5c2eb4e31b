"""The log-probabilities every strategy computes (``trainers/strategies/vocab.py``), by
hand and against autograd through the plain formula (one process: the sums over
tensor-parallel ranks are the local sums; the spawned Megatron tests cover TP=2)."""

from __future__ import annotations

import math

import pytest
import torch

from agentgym.trainers.strategies.vocab import VocabSlice, vocab_parallel_logprobs


def test_log_softmax_masks_the_padding_rows_and_divides_by_the_temperature() -> None:
    # one rank holds ids 0..3; id 3 is a padding row (vocab_size 3); temperature 2
    logits = torch.tensor([[[2.0, 0.0, 4.0, 9.0]]])  # [B=1, T=1, V_padded=4]
    logprob, entropy = vocab_parallel_logprobs(
        logits,
        torch.tensor([[2]]),
        VocabSlice.whole(3),  # TP=1: the sums over ranks are the local sums
        temperature=2.0,
        with_entropy=True,
    )
    # by hand: p = softmax([1, 0, 2]); log p(2) = 2 - log(e + 1 + e²)
    z = math.e + 1 + math.e**2
    assert logprob.item() == pytest.approx(2 - math.log(z), abs=1e-6)
    expected = -sum(math.exp(s) / z * (s - math.log(z)) for s in (1.0, 0.0, 2.0))
    assert entropy is not None
    assert entropy.item() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_entropy", [False, True])
def test_log_softmax_gradients_are_autograds_through_the_plain_formula(
    dtype: torch.dtype, with_entropy: bool
) -> None:
    # The in-place forward and hand-written backward against float64 autograd through
    # log_softmax; two padding rows (vocabulary 9 of 11), temperature 0.7.
    torch.manual_seed(0)
    logits = (torch.randn(3, 5, 11, dtype=torch.float64) * 3).to(dtype)
    targets = torch.randint(0, 9, (3, 5))
    upstream = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 5, dtype=torch.float64)
    reference = logits.clone().requires_grad_()
    log_p = torch.log_softmax(reference.double()[..., :9] / 0.7, -1)
    expected = log_p.gather(-1, targets[..., None])[..., 0], -(log_p.exp() * log_p).sum(-1)
    objective = (expected[0] * upstream[0]).sum()
    if with_entropy:
        objective = objective + (expected[1] * upstream[1]).sum()
    objective.backward()
    mine = logits.clone().requires_grad_()
    logprob, entropy = vocab_parallel_logprobs(
        mine,
        targets,
        VocabSlice.whole(9),
        temperature=0.7,
        with_entropy=with_entropy,
    )
    objective = (logprob * upstream[0].float()).sum()
    if with_entropy:
        assert entropy is not None
        torch.testing.assert_close(entropy.double(), expected[1], rtol=0, atol=1e-5)
        objective = objective + (entropy * upstream[1].float()).sum()
    objective.backward()
    torch.testing.assert_close(logprob.double(), expected[0], rtol=0, atol=2e-6)
    assert mine.grad is not None and mine.grad.dtype == dtype
    assert torch.all(mine.grad[..., 9:] == 0)
    torch.testing.assert_close(mine.grad, reference.grad, rtol=0, atol=1e-5)


def test_log_softmax_refuses_a_second_backward_pass() -> None:
    # Its softmax becomes the gradient in place: a second pass would read a gradient.
    logits = torch.randn(2, 3, 5, requires_grad=True)
    logprob, _ = vocab_parallel_logprobs(
        logits, torch.zeros(2, 3, dtype=torch.long), VocabSlice.whole(5), temperature=1.0
    )
    logprob.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="runs once"):
        logprob.sum().backward()
