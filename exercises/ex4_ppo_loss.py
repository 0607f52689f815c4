"""Exercise 4: the PPO-clip loss with a token-mean that stays exact across micro-batches
(METHOD.md section 5; the project's version: advantage.policy_loss).

Check your answer:  python -m exercises.check 4
"""
import torch


def policy_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, token_adv: torch.Tensor, mask: torch.Tensor,
                  num_tokens: int, ppo_clip: float) -> torch.Tensor:
    """L = sum over trained tokens of max(-Ahat * r, -Ahat * clip(r, 1 - c, 1 + c)) / num_tokens.

    logp_new (b, T): log-probs under the policy being trained (gradient flows through them);
    logp_old (b, T): the same tokens before the update (no gradient); r = exp(logp_new - logp_old);
    token_adv (b, T): Ahat; mask (b, T) bool: True = a trained token. These b rows are one
    micro-batch of a minibatch; num_tokens is the count of response tokens in the *whole*
    minibatch (rows that sit out the update, their Ahat 0, included), so that summing the losses (and gradients) of its micro-batches gives exactly the
    minibatch's token mean. Returns a scalar.
    """
    raise NotImplementedError("exercise 4: write policy_loss (METHOD.md section 5)")
