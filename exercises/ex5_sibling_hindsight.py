"""Exercise 5: sibling hindsight (METHOD.md section 2; the project's version: segments.sibling_hindsight).

Check your answer:  python -m exercises.check 5
"""
from segments import SIBLING_HEADLINE, Trajectory, format_plan  # noqa: F401  (you will need them)


def sibling_hindsight(trajs: list[Trajectory]) -> list[str | None]:
    """Each trajectory's hindsight block under --hindsight sibling, or None.

    The block is format_plan(SIBLING_HEADLINE, trajs[j].actions) for j the shortest successful
    trajectory (fewest steps; traj.won, len(traj.steps)) of the same group (traj.group), ties
    going to the lowest index, and never the trajectory itself: the lone success of a group,
    and every trajectory of a group without success, get None.
    """
    raise NotImplementedError("exercise 5: write sibling_hindsight (METHOD.md section 2)")
