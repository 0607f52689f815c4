"""Checks for the exercises, one command each: cases worked out by hand, and the properties
METHOD.md says the code keeps. A failed check says in words what is wrong.

Run: python -m exercises.check 1            (1-6, or all)
     python -m exercises.check all --solution   (the project's own implementations: all pass)
"""
from __future__ import annotations

import argparse
import importlib
import math
import sys
import traceback

import torch

import advantage
import baselines
import segments

EXERCISES = {  # number: (module in exercises/, function name, what it is)
    1: ("ex1_grpo_advantage", "grpo_advantages", "the GRPO group advantage"),
    2: ("ex2_segment_gap", "segment_gap", "the segment gap"),
    3: ("ex3_token_advantage", "token_advantages", "the bounded multiplier and the token advantage"),
    4: ("ex4_ppo_loss", "policy_loss", "the PPO-clip loss, token-mean across micro-batches"),
    5: ("ex5_sibling_hindsight", "sibling_hindsight", "sibling hindsight"),
    6: ("ex6_gigpo_step_advantage", "gigpo_step_advantages", "GiGPO's step groups and step advantage"),
}


def solution(n: int):
    """The project's own implementation of exercise n: the very function train.py's loop calls."""
    return {1: advantage.grpo_advantages, 2: advantage.segment_gap, 3: advantage.token_advantages,
            4: advantage.policy_loss, 5: segments.sibling_hindsight, 6: baselines.gigpo_step_advantages}[n]


# ----------------------------------------------------------------------------- helpers
def close(a, b, tol=1e-5) -> bool:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    return a.shape == b.shape and bool(torch.allclose(a, b, atol=tol, rtol=0))


def show(x) -> str:
    if isinstance(x, torch.Tensor):
        return str([round(v, 4) for v in x.double().flatten().tolist()]) + f" (shape {tuple(x.shape)})"
    return repr(x)


# ----------------------------------------------------------------------------- the checks
def check_1(f):
    A = f(torch.tensor([10.0, 0.0, 0.0, 0.0]), torch.tensor([0, 0, 0, 0]))
    # mean 2.5; unbiased std sqrt((7.5^2 + 3 * 2.5^2) / 3) = 5
    yield close(A, [1.5, -0.5, -0.5, -0.5]), (
        f"rewards [10, 0, 0, 0] in one group: expected [1.5, -0.5, -0.5, -0.5] (mean 2.5, unbiased std 5), "
        f"got {show(A)}. Is the std unbiased (divide by n - 1)?")
    A = f(torch.tensor([3.0, 3.0, 3.0]), torch.tensor([1, 1, 1]))
    yield bool((A == 0).all()), f"a group whose rewards all tie must give exactly 0 (no NaN, no noise), got {show(A)}"
    A = f(torch.tensor([5.0, 1.0, 2.0]), torch.tensor([4, 9, 9]))
    yield A[0] == 0 and not torch.isnan(A).any(), f"a group of one has no baseline: its A must be 0, got {show(A)}"
    A = f(torch.tensor([1.0, 0.0, 10.0, 20.0]), torch.tensor([7, 7, 3, 3]))
    yield close(A, [0.7071, -0.7071, -0.7071, 0.7071], 1e-3), (
        f"groups are compared only within themselves (labels 7 and 3): expected about [0.707, -0.707, -0.707, 0.707], "
        f"got {show(A)}")
    r, g = torch.tensor([4.0, 1.0, 0.0, 2.0, 9.0, 9.5]), torch.tensor([0, 0, 0, 1, 1, 1])
    A = f(r, g)
    yield close(A[:3].sum(), 0) and close(A[3:].sum(), 0), f"advantages must sum to 0 within each group, got {show(A)}"
    yield A.dtype == r.dtype and A.shape == r.shape, f"expected shape {tuple(r.shape)} and dtype {r.dtype}, got {A.dtype}"


def check_2(f):
    lt = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-1.0, -1.0, -3.0, -2.0]])
    ls = torch.tensor([[-1.1, -1.7, -0.7, -9.0], [-1.0, -2.0, -1.0, -2.0]])
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    g = f(lt, ls, mask)
    # row 0: deltas 0.1, -0.3, 0.2 (the padding's 9.0 is no token) -> 0; row 1: 0, 1, -2, 0 -> -0.25
    yield close(g, [0.0, -0.25]), (
        f"expected gaps [0, -0.25] (row 0's padding token counts nowhere), got {show(g)}. "
        f"Is the mean over the row's own response tokens, teacher minus student?")
    only = torch.tensor([[False, True, True, False], [False, False, False, False]])
    g = f(lt, ls, mask, only)
    yield close(g, [-0.05, 0.0]), (
        f"with gap_mask only the masked tokens count: expected [-0.05, 0] (row 1 has no masked token: 0, not NaN), "
        f"got {show(g)}")
    g = f(ls, ls, mask)
    yield close(g, torch.zeros(2)), f"a teacher equal to the student must give gap 0 everywhere, got {show(g)}"
    lt_grad = lt.clone().requires_grad_(True)
    out = f(lt_grad, ls, mask)
    yield not out.requires_grad, "no gradient may flow into the teacher: detach the teacher's log-probs"


def check_3(f):
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
    adv, gaps = torch.tensor([2.0, -1.0, 1.0]), torch.tensor([0.1, 0.1, -1.0])
    result = f(adv, gaps, mask, lam=0.5, eps_m=0.2)
    if not (isinstance(result, tuple) and len(result) == 2):
        yield False, (f"return a pair: (Ahat (B, T), m (B,)), the token advantages and the multipliers they "
                      f"applied; got {type(result).__name__}")
        return
    out, mults = result
    m0, m1, m2 = math.exp(0.1), math.exp(-0.1), 0.8  # sign(A) * g; the last clipped at 1 - eps
    yield close(mults, [m0, m1, m2]), (
        f"expected the multipliers m = clip(exp(sign(A) * g), 0.8, 1.2) = {show(torch.tensor([m0, m1, m2]))}, "
        f"got {show(mults)}")
    want = [[2 * (0.5 + 0.5 * m0)] * 2 + [0.0], [-(0.5 + 0.5 * m1)] * 3, [0.5 + 0.5 * m2, 0.0, 0.0]]
    yield close(out, want), (
        f"expected {show(torch.tensor(want))}, got {show(out)}. m = clip(exp(sign(A) * g), 1 - eps, 1 + eps), "
        f"then Ahat = A * ((1 - lam) + lam * m) on segment tokens and 0 on padding")
    torch.manual_seed(0)
    adv, gaps = torch.randn(64) * 3, torch.randn(64)
    adv[::7] = 0.0
    mask = torch.ones(64, 5, dtype=torch.bool)
    out = f(adv, gaps, mask, lam=0.7, eps_m=0.2)[0][:, 0]
    yield bool((torch.sign(out) == torch.sign(adv)).all()), "sign(Ahat) must equal sign(A): the reward sets the direction"
    yield bool(((out - adv).abs() <= 0.7 * 0.2 * adv.abs() + 1e-6).all()), (
        "|Ahat - A| must stay within lam * eps_m * |A|: is the multiplier clipped to [1 - eps_m, 1 + eps_m]?")
    yield close(f(adv, gaps, mask, lam=0.0, eps_m=0.2)[0][:, 0], adv), "lam = 0 must give GRPO exactly: Ahat = A"
    yield bool((out[adv == 0] == 0).all()), "A = 0 must give Ahat = 0, whatever the teacher says"
    yield close(f(adv, torch.zeros(64), mask, lam=0.5, eps_m=0.2)[0][:, 0], adv), "a gap of 0 (teacher = student) must give Ahat = A"


def check_4(f):
    lp_old = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]))
    lp_new = torch.log(torch.tensor([[0.75, 0.25, 0.5], [0.5, 0.5, 0.5]]))  # ratios 1.5, 0.5, 1 | 1, 1, 1
    adv = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    loss = f(lp_new, lp_old, adv, mask, 5, 0.2)
    # per token: -min(1.5, 1.2) = -1.2; -min(0.5, 0.8) = -0.5; -1; +2; +2 -> sum 1.3 / 5 tokens
    yield close(loss, 1.3 / 5), (
        f"expected loss 0.26: per token max(-A r, -A clip(r, 0.8, 1.2)) = -1.2, -0.5, -1.0, +2, +2 over 5 trained "
        f"tokens, got {show(loss)}. Is the clip pessimistic (the larger loss), and the padding token left out?")
    torch.manual_seed(1)
    lp_old = -torch.rand(6, 4) * 2
    base = lp_old + torch.randn(6, 4) * 0.3
    adv = torch.randn(6, 4)
    mask = torch.rand(6, 4) > 0.3
    n = int(mask.sum())
    whole_in = base.clone().requires_grad_(True)
    whole = f(whole_in, lp_old, adv, mask, n, 0.2)
    whole.backward()
    parts_in = base.clone().requires_grad_(True)
    total = f(parts_in[:2], lp_old[:2], adv[:2], mask[:2], n, 0.2) + f(parts_in[2:], lp_old[2:], adv[2:], mask[2:], n, 0.2)
    total.backward()
    yield close(whole, total, 1e-6), (
        f"two micro-batches with num_tokens = the minibatch's count must add up to the whole minibatch's loss: "
        f"{whole.item():.6f} vs {total.item():.6f}. Divide by num_tokens, not by this call's own token count")
    yield close(whole_in.grad, parts_in.grad, 1e-6), "the micro-batches' gradients must add up to the whole minibatch's"
    yield bool((whole_in.grad[~mask] == 0).all()), "a token outside the mask must get no gradient"


def _traj(group, won, actions):
    steps = [segments.Step([], [], [], a, a, 10.0 * (won and k == len(actions) - 1)) for k, a in enumerate(actions)]
    return segments.Trajectory(f"task-{group}", group, "t", steps, won=won)


def check_5(f):
    plan = lambda t: segments.format_plan(segments.SIBLING_HEADLINE, t.actions)  # noqa: E731
    trajs = [_traj(0, True, ["a", "b", "c"]), _traj(0, True, ["x", "y"]), _traj(0, False, ["a"]),
             _traj(0, True, ["p", "q"]), _traj(1, True, ["only"]), _traj(1, False, ["z", "z"]),
             _traj(2, False, ["n"]), _traj(2, False, ["m"])]
    out = f(trajs)
    yield isinstance(out, list) and len(out) == len(trajs), f"expected one entry per trajectory ({len(trajs)}), got {out!r}"
    want = [plan(trajs[1]), plan(trajs[3]), plan(trajs[1]), plan(trajs[1]), None, plan(trajs[4]), None, None]
    names = ["0 (won, 3 steps)", "1 (won, 2 steps)", "2 (failed)", "3 (won, 2 steps)", "4 (the lone success of group 1)",
             "5 (failed, group 1)", "6 (group 2, no success)", "7 (group 2, no success)"]
    for k, (got, w) in enumerate(zip(out, want)):
        why = {0: "the shortest successful group mate is 1 (2 steps; 3 ties with it and 1 has the lower index)",
               1: "never oneself: the shortest other success is 3",
               2: "the shortest success of its group, ties to the lowest index: 1",
               3: "never oneself: the shortest other success is 1",
               4: "the lone success of a group has no other success to learn from: None",
               5: "its group's success is 4",
               6: "a group without success gives no hindsight: None", 7: "a group without success gives no hindsight: None"}[k]
        yield got == w, f"trajectory {names[k]}: {why}; expected {w!r}, got {got!r}"


def check_6(f):
    rewards = torch.tensor([0.0, 0.0, 10.0, 0.0, 10.0, 0.0, 0.0])
    traj = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    groups = [0, 0, 0, 0, 0, 1, 1]
    anchors = ["start", "room", "fridge", "start", "fridge", "start", "room"]
    adv, ids = f(rewards, traj, groups, anchors, 0.5)
    same = lambda i, j: bool(ids[i] == ids[j])  # noqa: E731
    yield same(0, 3) and same(2, 4), "rows of one episode group acting from the same anchor share a step group (0 and 3; 2 and 4)"
    yield not same(0, 5) and not same(1, 6), "the same anchor text in another episode group is another step group (0 vs 5, 1 vs 6)"
    yield not same(0, 1) and not same(1, 2), "different anchors are different step groups"
    # returns with gamma 0.5: trajectory 0: 2.5, 5, 10; trajectory 1: 5, 10; trajectory 2: 0, 0
    # step group "start" of group 0: returns 2.5 (row 0) and 5 (row 3) -> -0.707, +0.707; "fridge": 10 and 10 -> 0
    want = [-0.7071, 0.0, 0.0, 0.7071, 0.0, 0.0, 0.0]
    yield close(adv, want, 1e-3), (
        f"expected step advantages about {want}: discounted returns (gamma 0.5) 2.5, 5, 10 | 5, 10 | 0, 0, compared "
        f"within step groups as GRPO compares rewards (a step group of one, or of ties, gives 0); got {show(adv)}")
    yield adv.dtype == torch.float32 and ids.dtype == torch.long, f"expected float32 advantages and long ids, got {adv.dtype}, {ids.dtype}"


CHECKS = {1: check_1, 2: check_2, 3: check_3, 4: check_4, 5: check_5, 6: check_6}


def load(n: int):
    """The function as written in exercises/<module>.py."""
    module, name, _ = EXERCISES[n]
    return getattr(importlib.import_module(f"exercises.{module}"), name)


def problems(n: int, f) -> list[str]:
    """The failed checks of exercise n for function f, each said in words; [] = all passed."""
    out = []
    try:
        for ok, message in CHECKS[n](f):
            if not ok:
                out.append(message)
    except NotImplementedError:
        out.append(f"not written yet: fill in {EXERCISES[n][1]} in exercises/{EXERCISES[n][0]}.py")
    except Exception as err:  # a crash in the student's code is a failed check with its cause
        where = traceback.extract_tb(err.__traceback__)[-1]
        out.append(f"it raised {type(err).__name__}: {err} (at {where.filename.split('/')[-1]}:{where.lineno})")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m exercises.check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("exercise", help="1-6, or all")
    parser.add_argument("--solution", action="store_true", help="check the project's own implementation instead")
    args = parser.parse_args(argv)
    if args.exercise != "all" and (not args.exercise.isdigit() or int(args.exercise) not in EXERCISES):
        parser.error(f"exercise must be 1-{len(EXERCISES)} or all; got {args.exercise!r}")
    torch.set_num_threads(1)
    failed = 0
    for n in EXERCISES if args.exercise == "all" else [int(args.exercise)]:
        found = problems(n, solution(n) if args.solution else load(n))
        print(f"exercise {n}, {EXERCISES[n][2]}: " + ("all checks pass" if not found else f"{len(found)} to fix"))
        for message in found:
            print(f"  - {message}")
        failed += bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
