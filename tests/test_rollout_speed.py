"""The rollouts' [speed] path (speed.shared_prefix_generate): each prompt prefix shared by several rows of a
generate call is prefilled once; the sampling, the log-probs of the sampled tokens and the episodes are
the plain path's (rollout.generate), to float rounding."""
import pytest
import torch

import rollout

from infra.models import load_policy
from rollout import ModelPolicy, play_episodes
from segments import generation_prompt_ids
from speed import FastPath, common_length, prefix_clusters

torch.set_num_threads(1)


def test_prefix_clusters_by_hand():
    """Prompts sharing at least 16 tokens share a prefix (shrunk to what they all share); each prefix stops
    one token before its shortest member's end; a prompt sharing less stands alone, and so does one whose
    join would cost the cluster's members more than it saves."""
    a = list(range(40))
    b = list(range(30)) + [99] * 5
    c = list(range(40))  # a's twin: a group's first turn
    d = list(range(10)) + [7] * 30  # shares only 10 tokens
    e = list(range(18)) + [5] * 30  # shares 18: joining would cost a, b, c 12 tokens each
    cluster_of, lengths = prefix_clusters([a, b, c, d, e])
    assert cluster_of == [0, 0, 0, 1, 2] and lengths == [30, 39, 47]
    assert prefix_clusters([a, c])[1] == [39]  # identical prompts: all but the last token
    assert common_length(a, b) == 30 and common_length(a, d) == 10


def spy_logits(model, log):
    """Make model.generate record each step's logits (the sampling distribution) in `log`."""
    real = model.generate

    def generate(*args, **kwargs):
        config = kwargs["generation_config"]
        config.output_logits, config.return_dict_in_generate = True, True
        out = real(*args, **kwargs)
        log.append(torch.stack(out.logits, 1).float().log_softmax(-1))  # (B, new, V)
        return out.sequences
    model.generate = generate


@pytest.mark.parametrize("batch", [0, 3])
def test_the_cached_prefill_samples_what_the_plain_one_does(batch):
    """Rows of one group (the same prompt), rows that share a task but not their history, and a row of
    another task, in one call or in --rollout-batch chunks: with the same seed the two paths sample the
    same ids, and the log-probs of every step's distribution agree to 1e-5 (float32)."""
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=1)
    with torch.no_grad():  # a LoRA that is not zero, so the adapter's path is in the comparison too
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    task = "You are a household agent. Your task is to: put a clean mug in the coffeemachine. "
    tails = ["You see a countertop 1.", "You see a countertop 1.", "You see a countertop 1.",
             "Past: go to sinkbasin 1. You arrive at sinkbasin 1; on it, a mug 1 and a knife 2.",
             "Past: look. You are in the middle of a room.", ""]
    contexts = [[{"role": "user", "content": task + t}] for t in tails]
    contexts[-1] = [{"role": "user", "content": "Your task is to: look at a book under the desklamp."}]
    prompts = [generation_prompt_ids(tok, m) for m in contexts]
    assert prefix_clusters(prompts)[0] == [0, 0, 0, 0, 0, 1]  # the task's rows share one prefix, the other
    # task's row shares only the template's header and stands alone
    logs, sampled = {}, {}
    for name, sample in (("plain", rollout.generate), ("fast", FastPath(tok.pad_token_id).generate)):
        logs[name] = []
        spy_logits(model, logs[name])
        torch.manual_seed(3)
        sampled[name] = ModelPolicy(model, tok, max_new_tokens=6, temperature=1.0, batch=batch,
                                    generate=sample).generate(prompts)
        del model.generate  # the spy, off again
    assert [s[1] for s in sampled["plain"]] == [s[1] for s in sampled["fast"]]
    for plain, fast in zip(logs["plain"], logs["fast"]):
        assert (plain - fast).abs().max() < 1e-5
    assert len({tuple(s[1]) for s in sampled["plain"][:3]}) > 1  # the group's rows sampled apart: not vacuous


def test_a_greedy_rollout_of_the_demo_s_games_takes_the_same_actions_both_ways():
    """The embedded model with the demo's warm start, greedy, on 2 of the shipped games, 2 episodes each, 3
    turns: every episode's actions are the same with the shared-prefix prefill as without it."""
    from envs import make_env, training_tasks
    from infra.config import DATA, WARMSTART

    model, tok = load_policy("smollm2", lora_r=8, lora_alpha=16, init_adapter=WARMSTART, dtype="fp32")
    env = make_env("alfworld", data_dir=DATA / "alfworld", max_steps=3)
    tasks = training_tasks(env, "train", 4)[:2]
    actions = {}
    for name, sample in (("plain", rollout.generate), ("fast", FastPath(tok.pad_token_id).generate)):
        policy = ModelPolicy(model, tok, max_new_tokens=48, temperature=0.0, generate=sample)
        trajs = play_episodes(env, [t for t in tasks for _ in range(2)], policy, history_len=2)
        actions[name] = [[s.action for s in t.steps] for t in trajs]
    env.close()
    assert actions["plain"] == actions["fast"] and sum(len(a) for a in actions["plain"]) >= 8
