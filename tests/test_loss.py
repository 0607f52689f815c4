"""The loss (METHOD.md section 5): PPO-clip with a token-mean (policy_loss), the k3 KL term
(kl_loss) and the SDAR term (sdar_loss), which train.py adds; and the update's statistics."""
import math

import pytest
import torch

from advantage import kl_loss, policy_loss, segment_gap, token_advantages
from baselines import sdar_loss
from report import loss_stats


def test_loss_by_hand():
    """Two trained tokens, ratio exp(0.1) and exp(-0.5), advantages +1 and -1, clip 0.2:
    token 1: max(-1.105, -1.105) = -1.10517 (inside the clip range);
    token 2: ratio 0.6065 < 0.8 with A = -1: max(0.6065, 0.8) = 0.8 (clipped).
    Token-mean over the 2 trained tokens (the third is masked): (-1.10517 + 0.8) / 2."""
    logp_old = torch.zeros(1, 3)
    logp_new = torch.tensor([[0.1, -0.5, 3.0]])
    adv = torch.tensor([[1.0, -1.0, 5.0]])
    mask = torch.tensor([[True, True, False]])
    loss = policy_loss(logp_new, logp_old, adv, mask, 2, 0.2)
    assert loss.item() == pytest.approx((-math.exp(0.1) + 0.8) / 2, rel=1e-6)
    assert loss_stats(logp_new, logp_old, adv, mask, 2, 2, 0.2)["clip_frac"].item() == pytest.approx(0.5)


@pytest.mark.parametrize("log_ratio,adv,clipped", [(0.3, 1.0, True), (0.1, 1.0, False), (-0.3, 1.0, False),
                                                   (-0.3, -1.0, True), (0.3, -1.0, False), (-0.1, -1.0, False)])
def test_clipping_engages_outside_range(log_ratio, adv, clipped):
    """The gradient vanishes exactly when the ratio leaves [0.8, 1.2] in the direction the
    advantage pushes (PPO's pessimistic bound); otherwise it is A * ratio."""
    logp_new = torch.tensor([[log_ratio]], requires_grad=True)
    loss = policy_loss(logp_new, torch.zeros(1, 1), torch.tensor([[adv]]), torch.ones(1, 1, dtype=torch.bool), 1, 0.2)
    loss.backward()
    if clipped:
        assert logp_new.grad.item() == 0.0
    else:
        assert logp_new.grad.item() == pytest.approx(-adv * math.exp(log_ratio))


def test_no_gradient_outside_segments_and_none_to_teacher():
    """Masked tokens get zero gradient; the teacher's log-probs never receive a gradient,
    neither through the advantage nor through the SDAR term."""
    g = torch.Generator().manual_seed(0)
    logp_old = -torch.rand(2, 5, generator=g)
    logp_new = (logp_old + 0.05 * torch.randn(2, 5, generator=g)).requires_grad_(True)
    logp_teacher = (logp_old + 0.3 * torch.randn(2, 5, generator=g)).requires_grad_(True)
    mask = torch.tensor([[True, True, True, False, False], [True, True, True, True, False]])
    adv, _ = token_advantages(torch.tensor([1.0, -1.0]), segment_gap(logp_teacher, logp_old, mask), mask, 0.5, 0.2)
    n = int(mask.sum())
    loss = policy_loss(logp_new, logp_old, adv, mask, n, 0.2) + 0.1 * kl_loss(logp_old, logp_new, mask, n) \
        + 0.5 * sdar_loss(logp_new, logp_teacher, logp_old, mask, n, 5.0)
    loss.backward()
    assert torch.equal(logp_new.grad[~mask], torch.zeros_like(logp_new.grad[~mask]))
    assert (logp_new.grad[mask] != 0).all()
    assert logp_teacher.grad is None


def test_micro_batches_accumulate_to_the_minibatch_token_mean():
    """Two micro-batches, each divided by the minibatch's token count, accumulate to the
    same gradient as one pass over the whole minibatch (rows of different lengths)."""
    g = torch.Generator().manual_seed(1)
    B, T = 4, 6
    logp_old = -torch.rand(B, T, generator=g)
    new0 = logp_old + 0.1 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, T, generator=g)
    mask = torch.tensor([[1] * 6, [1] * 2 + [0] * 4, [1] * 5 + [0], [1] + [0] * 5]).bool()
    ref = new0 - 0.05
    n = int(mask.sum())

    def loss(new, rows):
        return policy_loss(new, logp_old[rows], adv[rows], mask[rows], n, 0.2) + 0.01 * kl_loss(ref[rows], new, mask[rows], n)

    whole = new0.clone().requires_grad_(True)
    loss(whole, slice(0, 4)).backward()
    parts = new0.clone().requires_grad_(True)
    for rows in (slice(0, 1), slice(1, 4)):
        loss(parts[rows], rows).backward()
    assert torch.allclose(whole.grad, parts.grad, atol=1e-7)


def test_approx_kl_old_is_the_mean_over_the_trained_tokens_whatever_the_loss_divides_by():
    """train.py divides the loss by every response token of the minibatch (rows left out of the
    loss too), but approx_kl_old is the k3 mean over the trained tokens alone: accumulated over
    micro-batches with their count, it equals that mean computed in one piece, and it does not
    fall as more rows are left out."""
    g = torch.Generator().manual_seed(5)
    logp_old = -torch.rand(4, 5, generator=g)
    logp_new = logp_old + 0.2 * torch.randn(4, 5, generator=g)
    trained = torch.zeros(4, 5, dtype=torch.bool)
    trained[:2] = True  # rows 2 and 3 are left out of the loss (A = 0)
    r = torch.exp(logp_new - logp_old)
    expected = float(((r - 1 - (logp_new - logp_old))[trained]).mean())
    total, n_all, n_trained = 0.0, 20, int(trained.sum())
    for rows in (slice(0, 1), slice(1, 4)):
        stats = loss_stats(logp_new[rows], logp_old[rows], torch.ones(logp_new[rows].shape), trained[rows],
                           n_all, n_trained, 0.2)
        total += float(stats["approx_kl_old"])
    assert total == pytest.approx(expected, rel=1e-6)
    alone = loss_stats(logp_new[:2], logp_old[:2], torch.ones(2, 5), trained[:2], 10, 10, 0.2)
    assert float(alone["approx_kl_old"]) == pytest.approx(expected, rel=1e-6)


def test_sdar_term_raises_logp_in_proportion_to_the_gate():
    """SDAR: d loss / d logp_new = -coef * sigmoid(beta * delta) / n_hindsight_tokens < 0, so a
    gradient step raises the student's log-prob of sampled tokens, more where the teacher
    agrees (delta > 0). Rows without hindsight are not in the term."""
    logp_old = torch.zeros(2, 2)
    logp_new = torch.zeros(2, 2, requires_grad=True)
    logp_teacher = torch.tensor([[0.4, -0.4], [1.0, 1.0]])
    has_hindsight = torch.tensor([[True, True], [False, False]])
    loss = 0.01 * sdar_loss(logp_new, logp_teacher, logp_old, has_hindsight, 2, 5.0)
    loss.backward()
    gate = torch.sigmoid(5.0 * torch.tensor([0.4, -0.4]))
    assert torch.allclose(logp_new.grad[0], -0.01 * gate / 2)
    assert (logp_new.grad[0] < 0).all() and logp_new.grad[0, 0] < logp_new.grad[0, 1]
    assert torch.equal(logp_new.grad[1], torch.zeros(2))


def test_kl_k3_by_hand():
    """k3 = exp(ref - new) - (ref - new) - 1; with ref - new = 0.5: e^0.5 - 1.5."""
    kl = kl_loss(torch.full((1, 1), 0.5), torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool), 1)
    assert kl.item() == pytest.approx(math.exp(0.5) - 1.5)
