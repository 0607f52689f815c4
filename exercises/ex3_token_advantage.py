"""Exercise 3: the bounded multiplier and the token advantage (METHOD.md section 4, Eq. 4-5; train.py's
stage 5 calls the project's version, advantage.token_advantages, with this signature).

Check your answer:  python -m exercises.check 3
"""
import torch


def token_advantages(adv: torch.Tensor, gaps: torch.Tensor, response_mask: torch.Tensor, lam: float,
                     eps_m: float) -> tuple[torch.Tensor, torch.Tensor]:
    """m_i = clip(exp(sign(A_i) * g_i), 1 - eps_m, 1 + eps_m), and Ahat_{i,t} = A_i * ((1 - lam) + lam * m_i).

    adv (B,): A_i of each row's trajectory; gaps (B,): the gap g_i of each row's one segment;
    response_mask (B, T) bool: True on the row's response tokens, False on padding. Returns
    (Ahat (B, T): the same value on every token of a row's segment, 0 on padding; m (B,): the
    multiplier of each segment, which the training log reports).
    """
    raise NotImplementedError("exercise 3: write token_advantages (METHOD.md section 4)")
