"""Exercise 2: the segment gap (METHOD.md section 3, Eq. 2-3; train.py's stage 5 calls the project's
version, advantage.segment_gap, with this signature).

Check your answer:  python -m exercises.check 2
"""
import torch


def segment_gap(logp_teacher: torch.Tensor, logp_student: torch.Tensor, response_mask: torch.Tensor,
                gap_mask: torch.Tensor | None = None) -> torch.Tensor:
    """g_i = mean over the tokens t of row i's segment of (logp_teacher_t - logp_student_t).

    logp_teacher, logp_student (B, T) float: log-probs of the sampled tokens under the teacher
    (hindsight in its context) and the student; response_mask (B, T) bool: True on the row's
    response tokens (its one segment), False on padding. gap_mask (B, T) bool, optional: only
    tokens where it is True enter the mean (e.g. the tokens inside <action>...</action>,
    StepOPSD's action-only gap); default every response token.
    Returns (B,). A row with no counted token gives 0, never NaN. No gradient flows into the teacher.
    """
    raise NotImplementedError("exercise 2: write segment_gap (METHOD.md section 3)")
