"""--rollout vllm (vllm_rollout/policy.py), run in the vLLM environment (bash vllm_rollout/install_vllm.sh):
the act contract (prompt ids unchanged, sampled ids cut at the end of turn), vLLM serving the adapter the
trainer has now (its log-probs match the trainer's, far closer than a stale adapter's), and a 2-iteration
train.py run. The embedded SmolLM2-135M, float32 on the CPU, one thread."""
import json

import pytest
import torch

pytest.importorskip("vllm", reason="the vLLM extra is installed apart: bash vllm_rollout/install_vllm.sh")

from infra.models import load_policy
from segments import build_row, generation_prompt_ids  # noqa: E402
from speed import FastPath  # noqa: E402  (the trainer's default path)
from vllm_rollout.policy import VLLMPolicy  # noqa: E402

torch.set_num_threads(1)
CONTEXTS = [[{"role": "user", "content": text}] for text in (
    "Name one fruit. Answer in one word.", "Count from one to ten in words, separated by commas.",
    "Say hello.", "You are in a kitchen. What do you pick up first? Think step by step.")]
NEW = 24


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    torch.manual_seed(0)
    model, tok = load_policy("smollm2", lora_r=8, lora_alpha=16, dtype="fp32", seed=0, announce=lambda *_: None)
    policy = VLLMPolicy(model, tok, tmp_path_factory.mktemp("vllm"), NEW, 1.0, lora_r=8, seed=0)
    return model, tok, policy


def _move(model, seed):
    """An update large enough to move the policy: every LoRA B drawn anew."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def _mean_abs(policy, model, tok, outs, **kw):
    rows = [build_row(tok, c, r) for c, (_, r, _) in zip(CONTEXTS, outs)]
    T = max(len(r.response_ids) for r in rows)
    trainer = FastPath(tok.pad_token_id, 4).pass_logprobs(model, rows=rows, T=T)  # (B, T)
    diffs = [(torch.tensor(policy.sampled[(tuple(p), tuple(r))]) - trainer[b, : len(r)]).abs()
             for b, (p, r, _) in enumerate(outs)]
    return float(torch.cat(diffs).mean())


def test_prompt_ids_go_in_unchanged_and_responses_stop_after_the_end_of_turn(served):
    model, tok, policy = served
    policy.serve(model, 1)
    outs = policy.act(CONTEXTS, None)
    for context, (prompt, response, text) in zip(CONTEXTS, outs):
        assert prompt == generation_prompt_ids(tok, context)
        assert 0 < len(response) <= NEW
        ends = [j for j, t in enumerate(response) if t in policy.eos]
        assert ends in ([], [len(response) - 1])  # at most one end-of-turn id, and only as the last token
        assert ends or len(response) == NEW  # no end-of-turn: the length limit stopped it
        assert text == tok.decode(response, skip_special_tokens=True)
    assert policy.tokens_generated == sum(len(r) for _, r, _ in outs)
    policy.temperature = 0  # greedy: the same ids as transformers' generate, the end-of-turn id kept
    try:
        (prompt, response, _), = policy.act(CONTEXTS[:1], None)
    finally:
        policy.temperature = 1.0
    with torch.no_grad():
        hf = model.generate(input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                            max_new_tokens=NEW, do_sample=False, eos_token_id=policy.eos)[0, len(prompt):].tolist()
    assert response == hf and response[-1] in policy.eos and len(response) < NEW


def test_vllm_serves_the_adapter_the_trainer_has_now(served):
    """After each update, vLLM's log-probs of its own samples equal the trainer's recomputed ones
    (float32: within 2e-3 nats a token on average) and are far from those of the adapter before."""
    model, tok, policy = served
    for it, seed in ((2, 1), (3, 2)):
        before = {k: v.clone() for k, v in model.state_dict().items() if "lora_B" in k}
        _move(model, seed)
        policy.serve(model, it)
        outs = policy.act(CONTEXTS, None)
        now = _mean_abs(policy, model, tok, outs)
        after = {k: v.clone() for k, v in model.state_dict().items() if "lora_B" in k}
        model.load_state_dict(before, strict=False)  # the stale adapter: the one served before this update
        stale = _mean_abs(policy, model, tok, outs)
        model.load_state_dict(after, strict=False)
        print(f"iteration {it}: |vllm - trainer| {now:.2e}, |vllm - stale adapter| {stale:.2e}")
        assert now < 2e-3 and stale > 20 * now


def test_two_iterations_of_train_py_with_vllm_rollouts(tmp_path):
    """train.py --rollout vllm: 2 iterations of the WebShop demo's warm-started policy, one search
    step an episode (the base folder vLLM serves holds the merged warm start); each logs the
    rollout-vs-trainer difference
    (with a KL term, so that the student pass scores every row, tied groups' too)."""
    import train

    out = tmp_path / "run"
    train.main(["--env", "webshop", "--preset", "cpu-demo", "--rollout", "vllm", "--iterations", "2", "--groups", "1",
                "--group-size", "2", "--max-steps", "1", "--history", "0", "--max-new-tokens", "32", "--dtype", "fp32",
                "--eval-every", "0",
                "--kl-coef", "0.01",
                "--output-dir", str(out)])
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in lines] == [1, 2]
    for m in lines:
        print(f"iteration {m['iteration']}: rollout/logp_diff_mean {m['rollout/logp_diff_mean']:.2e}, "
              f"max {m['rollout/logp_diff_max']:.2e}, {m['tokens_generated']} tokens")
        assert m["tokens_generated"] > 0
        assert m["rollout/logp_diff_mean"] < 2e-3  # every row: the KL term keeps all of them in the student pass
    assert (out / "vllm" / "base" / "config.json").is_file()
    assert sorted(p.name for p in (out / "vllm").glob("adapter-*")) == ["adapter-000002"]  # the one served last
