"""The policy loss (METHOD.md section 5): PPO-clip, token-mean, k3 KL and the SDAR term."""
import math

import pytest
import torch

from advantage import policy_loss, segment_gap, token_advantages


def test_loss_by_hand():
    """Two trained tokens, ratio exp(0.1) and exp(-0.5), advantages +1 and -1, clip 0.2:
    token 1: max(-1.105, -1.105) = -1.10517 (inside the clip range);
    token 2: ratio 0.6065 < 0.8 with A = -1: max(0.6065, 0.8) = 0.8 (clipped).
    Token-mean over the 2 trained tokens (the third is masked): (-1.10517 + 0.8) / 2."""
    logp_old = torch.zeros(1, 3)
    logp_new = torch.tensor([[0.1, -0.5, 3.0]])
    adv = torch.tensor([[1.0, -1.0, 5.0]])
    mask = torch.tensor([[True, True, False]])
    loss, stats = policy_loss(logp_new, logp_old, adv, mask)
    assert loss.item() == pytest.approx((-math.exp(0.1) + 0.8) / 2, rel=1e-6)
    assert stats["clip_frac"].item() == pytest.approx(0.5)


@pytest.mark.parametrize("log_ratio,adv,clipped", [(0.3, 1.0, True), (0.1, 1.0, False), (-0.3, 1.0, False),
                                                   (-0.3, -1.0, True), (0.3, -1.0, False), (-0.1, -1.0, False)])
def test_clipping_engages_outside_range(log_ratio, adv, clipped):
    """The gradient vanishes exactly when the ratio leaves [0.8, 1.2] in the direction the
    advantage pushes (PPO's pessimistic bound); otherwise it is A * ratio."""
    logp_new = torch.tensor([[log_ratio]], requires_grad=True)
    loss, _ = policy_loss(logp_new, torch.zeros(1, 1), torch.tensor([[adv]]), torch.ones(1, 1, dtype=torch.bool))
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
    adv = token_advantages(torch.tensor([1.0, -1.0]), segment_gap(logp_teacher, logp_old, mask), mask)
    loss, _ = policy_loss(logp_new, logp_old, adv, mask, logp_ref=logp_old, kl_coef=0.1,
                          logp_teacher=logp_teacher, sdar_mask=mask, sdar_coef=0.5)
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

    whole = new0.clone().requires_grad_(True)
    policy_loss(whole, logp_old, adv, mask, logp_ref=ref, kl_coef=0.01)[0].backward()

    parts = new0.clone().requires_grad_(True)
    n = int(mask.sum())
    for rows in (slice(0, 1), slice(1, 4)):
        loss, _ = policy_loss(parts[rows], logp_old[rows], adv[rows], mask[rows], num_tokens=n,
                              logp_ref=ref[rows], kl_coef=0.01)
        loss.backward()
    assert torch.allclose(whole.grad, parts.grad, atol=1e-7)


def test_approx_kl_old_is_the_mean_over_the_trained_tokens_whatever_the_loss_divides_by():
    """train.py divides the loss by every response token of the minibatch (rows left out of the
    loss too), but approx_kl_old is the k3 mean over the trained tokens alone: accumulated over
    micro-batches with num_kl_tokens, it equals that mean computed in one piece, and it does not
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
        _, stats = policy_loss(logp_new[rows], logp_old[rows], torch.ones(logp_new[rows].shape), trained[rows],
                               num_tokens=n_all, num_kl_tokens=n_trained)
        total += float(stats["approx_kl_old"])
    assert total == pytest.approx(expected, rel=1e-6)
    _, alone = policy_loss(logp_new[:2], logp_old[:2], torch.ones(2, 5), trained[:2])
    assert float(alone["approx_kl_old"]) == pytest.approx(expected, rel=1e-6)


def test_sdar_term_raises_logp_in_proportion_to_the_gate():
    """SDAR: d loss / d logp_new = -coef * sigmoid(beta * delta) / n_hindsight_tokens < 0, so a
    gradient step raises the student's log-prob of sampled tokens, more where the teacher
    agrees (delta > 0). Rows without hindsight are not in the term."""
    logp_old = torch.zeros(2, 2)
    logp_new = torch.zeros(2, 2, requires_grad=True)
    logp_teacher = torch.tensor([[0.4, -0.4], [1.0, 1.0]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    has_hindsight = torch.tensor([[True, True], [False, False]])
    loss, _ = policy_loss(logp_new, logp_old, torch.zeros(2, 2), mask, logp_teacher=logp_teacher,
                          sdar_mask=has_hindsight, sdar_coef=0.01, sdar_beta=5.0)
    loss.backward()
    gate = torch.sigmoid(5.0 * torch.tensor([0.4, -0.4]))
    assert torch.allclose(logp_new.grad[0], -0.01 * gate / 2)
    assert (logp_new.grad[0] < 0).all() and logp_new.grad[0, 0] < logp_new.grad[0, 1]
    assert torch.equal(logp_new.grad[1], torch.zeros(2))


def test_kl_k3_by_hand():
    """k3 = exp(ref - new) - (ref - new) - 1; with ref - new = 0.5: e^0.5 - 1.5."""
    loss, stats = policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1, 1),
                              torch.ones(1, 1, dtype=torch.bool), logp_ref=torch.full((1, 1), 0.5), kl_coef=1.0)
    assert stats["kl_ref"].item() == pytest.approx(math.exp(0.5) - 1.5)
    assert loss.item() == pytest.approx(math.exp(0.5) - 1.5)


def test_missing_inputs_are_clear_errors():
    """Asking for KL or SDAR without their inputs says what is missing."""
    x, m = torch.zeros(1, 1), torch.ones(1, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="logp_ref"):
        policy_loss(x, x, x, m, kl_coef=0.1)
    with pytest.raises(ValueError, match="logp_teacher"):
        policy_loss(x, x, x, m, sdar_coef=0.1)
