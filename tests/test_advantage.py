"""GRPO advantage and the SHARPO token advantage (METHOD.md sections 1, 3, 4)."""
import math

import pytest
import torch

from advantage import grpo_advantages, segment_gap, segment_multipliers, token_advantages
from baselines import rlsd_token_advantages, shuffled_within_groups


# ----------------------------------------------------------------------------- GRPO
def test_grpo_by_hand():
    """Group of 3 rewards (10, 0, 0): mean 10/3, unbiased std sqrt(100/3); a second group of
    2 (1, 3): mean 2, std sqrt(2). Hand-computed values."""
    r = torch.tensor([10.0, 0.0, 0.0, 1.0, 3.0])
    g = torch.tensor([7, 7, 7, 2, 2])
    a = grpo_advantages(r, g, eps=0.0)
    s1 = math.sqrt(((20 / 3) ** 2 + 2 * (10 / 3) ** 2) / 2)
    expected = [(20 / 3) / s1, -(10 / 3) / s1, -(10 / 3) / s1, -1 / math.sqrt(2), 1 / math.sqrt(2)]
    assert torch.allclose(a, torch.tensor(expected), atol=1e-6)


def test_grpo_eps_in_denominator():
    """eps is added to the std, not to the variance."""
    r, g = torch.tensor([0.0, 2.0]), torch.tensor([0, 0])
    a = grpo_advantages(r, g, eps=1.0)
    s = math.sqrt(2.0)
    assert torch.allclose(a, torch.tensor([-1 / (s + 1), 1 / (s + 1)]))


def test_grpo_one_member_and_all_equal_groups_are_zero():
    """A one-member group has no baseline; an all-equal group has nothing to compare: both
    give exactly 0, never NaN, also for rewards whose mean is inexact in floating point."""
    r = torch.tensor([5.0, -0.3, -0.3, -0.3, 0.1, 0.1, 0.1])
    g = torch.tensor([0, 1, 1, 1, 2, 2, 2])
    a = grpo_advantages(r, g)
    assert torch.equal(a, torch.zeros(7))


def test_grpo_without_std():
    """norm_by_std=False gives R - group mean."""
    r = torch.tensor([10.0, 0.0, 2.0, 4.0])
    g = torch.tensor([1, 1, 0, 0])
    assert torch.allclose(grpo_advantages(r, g, norm_by_std=False), torch.tensor([5.0, -5.0, -1.0, 1.0]))


def test_shuffled_rewards_keep_each_groups_advantages_and_move_them_between_episodes():
    """The placebo control (--shuffle-rewards): per group, the same rewards and so the same advantages,
    sorted; across many draws, each episode's advantage is no longer its own."""
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.9, 0.1, -0.1, 0.9])  # two groups of 4
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    draw = torch.Generator().manual_seed(0)
    moved = 0
    for _ in range(50):
        s = shuffled_within_groups(r, g, draw)
        for k in (0, 1):
            assert torch.equal(s[g == k].sort().values, r[g == k].sort().values)
            assert torch.equal(grpo_advantages(s, g)[g == k].sort().values, grpo_advantages(r, g)[g == k].sort().values)
        moved += int(s[0] != 1.0)  # the winner of group 0 lost its reward
    assert 25 <= moved <= 50  # 3 draws in 4 move it: 37.5 expected of 50
    a, b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert torch.equal(shuffled_within_groups(r, g, a), shuffled_within_groups(r, g, b))  # seeded: a resume repeats it


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grpo_matches_loop(seed):
    """Vectorized GRPO equals a per-group Python loop (statistics.stdev is unbiased)."""
    import statistics

    gen = torch.Generator().manual_seed(seed)
    r = torch.randint(0, 3, (24,), generator=gen).double() * 5
    g = torch.randint(0, 6, (24,), generator=gen)
    fast = grpo_advantages(r, g)
    for i in range(24):
        members = [r[j].item() for j in range(24) if g[j] == g[i]]
        if len(members) < 2 or len(set(members)) == 1:
            want = 0.0
        else:
            want = (r[i].item() - statistics.mean(members)) / (statistics.stdev(members) + 1e-6)
        assert fast[i].item() == pytest.approx(want, abs=1e-9)


# ----------------------------------------------------------------------------- SHARPO
def _random_case(seed, B=6, T=20):
    g = torch.Generator().manual_seed(seed)
    adv = torch.randn(B, generator=g)
    adv[0] = 0.0  # one row with A = 0
    logp_s = -torch.rand(B, T, generator=g) * 3
    logp_t = logp_s + torch.randn(B, T, generator=g) * 0.5
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T) the response, then padding
    return adv, logp_t, logp_s, mask


VARIANTS = ["sharpo", "rlsd", "stepopsd"]


def ahat(variant, adv, lt, ls, mask, lam=0.5, eps_m=0.2):
    """The token advantage as train.py's stage 5 computes it for each variant."""
    if variant == "rlsd":
        return rlsd_token_advantages(adv, lt, ls, mask, lam, eps_m)[0]
    shape = "sigmoid" if variant == "stepopsd" else "exp"
    return token_advantages(adv, segment_gap(lt, ls, mask), mask, lam, eps_m, shape)[0]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("lam,eps_m", [(0.5, 0.2), (1.0, 0.5), (0.3, 0.05)])
def test_sharpo_properties(variant, seed, lam, eps_m):
    """METHOD.md section 4: sign(Ahat) = sign(A); |Ahat - A| <= lam * eps_m * |A|; A = 0 gives
    0; zero outside the segment; constant within a segment (RLSD exempt)."""
    adv, lt, ls, mask = _random_case(seed)
    out = ahat(variant, adv, lt, ls, mask, lam=lam, eps_m=eps_m)
    A = adv[:, None].expand_as(out)
    assert torch.equal(torch.sign(out[mask]), torch.sign(A[mask]))
    assert ((out - A).abs()[mask] <= lam * eps_m * A.abs()[mask] + 1e-6).all()
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))
    if variant != "rlsd":
        for b in range(mask.shape[0]):
            vals = out[b][mask[b]]
            assert torch.allclose(vals, vals[0].expand_as(vals))


@pytest.mark.parametrize("variant", VARIANTS)
def test_lam_zero_is_grpo_and_teacher_equals_student_is_identity(variant):
    """lam = 0 is exactly GRPO; teacher == student gives Ahat = A (multiplier 1)."""
    adv, lt, ls, mask = _random_case(7)
    A = torch.where(mask, adv[:, None].expand_as(mask).float(), 0.0)
    assert torch.equal(ahat(variant, adv, lt, ls, mask, lam=0.0), A)
    assert torch.allclose(ahat(variant, adv, ls, ls, mask, lam=0.7), A)


def test_sharpo_by_hand():
    """Two rows (one segment each), A = 2, gaps +0.1 and -0.5 (eps_m 0.2, lam 0.5):
    m = clip(exp(0.1)) = 1.10517, clip(exp(-0.5)) = 0.8 -> Ahat = 2*(0.5 + 0.5 m).
    With A = -2 the signs flip: m = clip(exp(-0.1)) = 0.904837, clip(exp(0.5)) = 1.2."""
    ls = torch.zeros(2, 2)
    lt = torch.tensor([[0.2, 0.0], [-0.5, -0.5]])
    mask = torch.ones(2, 2, dtype=torch.bool)
    gaps = segment_gap(lt, ls, mask)
    assert torch.allclose(gaps, torch.tensor([0.1, -0.5]))
    pos, m = token_advantages(torch.tensor([2.0, 2.0]), gaps, mask, 0.5, 0.2)
    m1, m2 = math.exp(0.1), 0.8
    assert torch.allclose(m, torch.tensor([m1, m2]))  # the multipliers Ahat applied, returned beside it
    assert torch.allclose(pos, torch.tensor([[2 * (0.5 + 0.5 * m1)] * 2, [2 * (0.5 + 0.5 * m2)] * 2]))
    neg, _ = token_advantages(torch.tensor([-2.0, -2.0]), gaps, mask, 0.5, 0.2)
    m1, m2 = math.exp(-0.1), 1.2
    assert torch.allclose(neg, torch.tensor([[-2 * (0.5 + 0.5 * m1)] * 2, [-2 * (0.5 + 0.5 * m2)] * 2]))
    # StepOPSD: m = clip(2 * sigmoid(0.1)) = 1.04996
    sig, _ = token_advantages(torch.tensor([2.0, 2.0]), gaps, mask, 0.5, 0.2, shape="sigmoid")
    assert sig[0, 0].item() == pytest.approx(2 * (0.5 + 0.5 * 2 / (1 + math.exp(-0.1))), rel=1e-6)
    # RLSD: per token, the first token's delta 0.2 saturates at 1.2, the second's 0 gives 1
    tok, m_t = rlsd_token_advantages(torch.tensor([2.0, 2.0]), lt, ls, mask, 0.5, 0.2)
    assert torch.allclose(tok[0], torch.tensor([2 * (0.5 + 0.5 * 1.2), 2.0]))
    assert torch.allclose(m_t[0], torch.tensor([1.2, 1.0]))  # each token's own multiplier


@pytest.mark.parametrize("seed", [0, 1])
def test_sharpo_matches_loop(seed):
    """The vectorized gap and token advantage equal a loop over rows and tokens."""
    adv, lt, ls, mask = _random_case(seed)
    lam, eps = 0.5, 0.2
    fast, _ = token_advantages(adv, segment_gap(lt, ls, mask), mask, lam=lam, eps_m=eps)
    slow = torch.zeros_like(fast)
    for b in range(mask.shape[0]):
        sign = (adv[b].item() > 0) - (adv[b].item() < 0)
        toks = [t for t in range(mask.shape[1]) if mask[b, t]]
        g = sum((lt[b, t] - ls[b, t]).item() for t in toks) / len(toks)
        m = min(max(math.exp(sign * g), 1 - eps), 1 + eps)
        for t in toks:
            slow[b, t] = adv[b] * ((1 - lam) + lam * m)
    assert torch.allclose(fast, slow, atol=1e-6)


def test_gap_mask_limits_the_gap_to_chosen_tokens():
    """With a gap mask (e.g. action tokens only) the gap averages only those tokens."""
    ls = torch.zeros(1, 4)
    lt = torch.tensor([[-1.0, -1.0, 0.1, 0.1]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    gaps = segment_gap(lt, ls, mask, gap_mask=torch.tensor([[False, False, True, True]]))
    assert gaps.item() == pytest.approx(0.1)
    assert segment_multipliers(torch.tensor([1.0]), gaps, 0.2).item() == pytest.approx(math.exp(0.1))
    # a segment with no gap tokens: gap 0, multiplier 1 (segments.action_masks never passes one: it falls back)
    assert segment_gap(lt, ls, mask, gap_mask=torch.zeros(1, 4, dtype=torch.bool)).item() == 0.0


@pytest.mark.parametrize("kw", [dict(lam=-0.1), dict(lam=1.5), dict(eps_m=0.0), dict(eps_m=1.0),
                                dict(shape="tanh")])
def test_invalid_settings_raise(kw):
    """Settings outside 0 <= lam <= 1, 0 < eps_m < 1, or unknown variants are clear errors."""
    adv, lt, ls, mask = _random_case(0)
    with pytest.raises(ValueError):
        token_advantages(adv, segment_gap(lt, ls, mask), mask, **{"lam": 0.5, "eps_m": 0.2, **kw})
