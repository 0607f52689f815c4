"""Exercise 2: the segment gap (METHOD.md section 3; the project's version: advantage.segment_multipliers).

Check your answer:  python -m exercises.check 2
"""
import torch


def segment_gap(logp_teacher: torch.Tensor, logp_student: torch.Tensor, segment_ids: torch.Tensor,
                gap_mask: torch.Tensor | None = None) -> torch.Tensor:
    """g_{i,k} = mean over the tokens t of segment k of (logp_teacher_t - logp_student_t).

    logp_teacher, logp_student (B, T) float: log-probs of the sampled tokens under the teacher
    (hindsight in its context) and the student; segment_ids (B, T) long: the segment of each
    token, -1 on tokens of no segment (padding). Each row may hold several segments 0..S-1.
    gap_mask (B, T) bool, optional: only tokens where it is True enter the mean (e.g. the tokens
    inside <action>...</action>, StepOPSD's action-only gap); default every segment token.
    Returns (B, S) with S = the largest segment id + 1. A segment with no counted token gives 0,
    never NaN. No gradient flows into the teacher.
    """
    raise NotImplementedError("exercise 2: write segment_gap (METHOD.md section 3)")
