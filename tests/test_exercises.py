"""The exercises' checks can fail and can pass: each fails on its blank template (as committed)
and on a typical wrong answer, and passes on the project's own implementation."""
import inspect
import sys

import pytest
import torch

import advantage
import baselines
import segments
from exercises import check

torch.set_num_threads(1)


@pytest.mark.parametrize("n", sorted(check.EXERCISES))
def test_a_blank_template_fails_its_check(n):
    blank = check.load(n)
    assert "raise NotImplementedError" in inspect.getsource(blank), (
        f"exercises/{check.EXERCISES[n][0]}.py is no longer blank: the repository keeps the templates blank "
        "(work on your own copy or branch)")
    found = check.problems(n, blank)
    assert found and "not written yet" in found[0]


@pytest.mark.parametrize("n", sorted(check.EXERCISES))
def test_the_project_s_own_implementation_passes(n):
    assert check.problems(n, check.solution(n)) == []


def biased_std(rewards, group_ids):  # divides by n, not n - 1
    return advantage.grpo_advantages(rewards, group_ids) * ((len(rewards) - 1) / len(rewards)) ** 0.5


def gap_with_padding(logp_teacher, logp_student, response_mask, gap_mask=None):  # averages padding too
    return (logp_teacher - logp_student).mean(1)


def unclipped_multiplier(adv, gaps, response_mask, lam=0.5, eps_m=0.2):
    m = torch.exp(torch.sign(adv) * gaps)
    return torch.where(response_mask, (adv * ((1 - lam) + lam * m))[:, None], torch.zeros(())), m


def per_call_mean(logp_new, logp_old, token_adv, mask, num_tokens, ppo_clip=0.2):  # its own token count
    return advantage.policy_loss(logp_new, logp_old, token_adv, mask, int(mask.sum()), ppo_clip)


def includes_oneself(trajs):
    out = []
    for t in trajs:
        wins = [u for u in trajs if u.group == t.group and u.won]
        out.append(segments.format_plan(segments.SIBLING_HEADLINE, min(wins, key=lambda u: len(u.steps)).actions)
                   if wins else None)
    return out


def undiscounted(r, t, g, a, gamma):
    return baselines.gigpo_step_advantages(r, t, g, a, 1.0)


@pytest.mark.parametrize("n, wrong, words", [
    (1, biased_std, "unbiased"), (2, gap_with_padding, "padding"), (3, unclipped_multiplier, "clipped"),
    (4, per_call_mean, "num_tokens"), (5, includes_oneself, "never oneself"), (6, undiscounted, "discounted"),
])
def test_a_typical_wrong_answer_fails_with_a_reason_in_words(n, wrong, words):
    found = check.problems(n, wrong)
    assert any(words in message for message in found), found


@pytest.mark.parametrize("n", sorted(check.EXERCISES))
def test_each_exercise_is_a_function_the_training_loop_calls(n):
    """One function per formula: what a student writes in exercise n is, in the project, the very
    function train.py's stages call, under the same name: train.py calls it, or an algorithm of the
    table --algo reads does (advantage.SHARPO and the baselines' subclasses, stages 3, 5 and 6)."""
    import train

    own = check.solution(n)
    callers = [train, advantage.row_advantages] + [k for a in baselines.ALGORITHMS.values() for k in type(a).__mro__
                                                   if k is not object]
    calls = [c for c in callers if f"{own.__name__}(" in inspect.getsource(c)
             and getattr(c if inspect.ismodule(c) else sys.modules[c.__module__], own.__name__, None) is own]
    assert calls, f"the training loop does not call {own.__module__}.{own.__name__}"
    assert check.EXERCISES[n][1] == own.__name__, "the exercise's function has the project's name"
    module, name, _ = check.EXERCISES[n]
    template = inspect.signature(getattr(__import__(f"exercises.{module}", fromlist=[name]), name))
    assert list(template.parameters)[: len(template.parameters)] == list(inspect.signature(own).parameters)[
        : len(template.parameters)], "the exercise's arguments are the loop's function's, in the same order"


def test_the_command_says_what_to_fix(capsys):
    assert check.main(["1"]) == 1
    assert "not written yet" in capsys.readouterr().out
    assert check.main(["all", "--solution"]) == 0
