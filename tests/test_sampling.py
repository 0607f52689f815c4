"""The rollouts' sampling (rollout.decode, rollout.draw): each step draws from softmax(logits /
temperature) of the policy's own logits, whatever defaults the model ships, and stops each row at
its end of turn."""
import torch

import rollout
from infra.models import load_policy
from rollout import ModelPolicy, draw

torch.set_num_threads(1)


def test_draw_samples_the_softmax_and_never_an_id_of_probability_zero():
    """200,000 rows of the same 8 logits (one of them -inf): each id's frequency is its softmax(logits / T)
    share within 5 standard errors, at T = 1 and 0.6, and the -inf id never comes."""
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0, float("-inf"), 1.5])
    n = 200_000
    for temperature in (1.0, 0.6):
        p = torch.softmax(logits / temperature, -1)
        u = torch.rand(n, 1, dtype=torch.float64)
        freq = torch.bincount(draw(logits.expand(n, 8), temperature, u), minlength=8) / n
        se = (p * (1 - p) / n).sqrt()
        assert ((freq - p).abs() <= 5 * se + 1e-12).all(), (freq, p)
        assert freq[6] == 0 and freq[5] > 0  # the -inf id never; a 0.2 % one does come


def test_decode_samples_the_model_s_own_logits_and_stops_each_row_at_its_end(monkeypatch):
    """With Qwen-like defaults on the model (top_k 20, top_p 0.8, a repetition penalty), the first step's
    distribution is the model's plain forward's, and 400 rows of one prompt sample far more than 20 ids
    (no top-k). A row that samples an end-of-turn id is padded after it, and the others go on; with
    config.min_new_tokens none can be sampled before that many tokens."""
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8)
    model.generation_config.top_k, model.generation_config.top_p = 20, 0.8
    model.generation_config.repetition_penalty = 1.05
    policy = ModelPolicy(model, tok, max_new_tokens=3)
    prompt = tok.encode("hello there")
    seen = []
    spy = model.get_output_embeddings().register_forward_hook(lambda m, a, out: seen.append(out.float()))
    torch.manual_seed(0)
    sampled = policy.generate([prompt] * 400)
    spy.remove()
    with torch.no_grad():
        plain = model(input_ids=torch.tensor([prompt])).logits[0, -1].log_softmax(-1)  # (V,)
    assert torch.allclose(seen[0].log_softmax(-1), plain.expand(400, -1), atol=1e-5)
    assert len({ids[0] for _, ids, _ in sampled}) > 100

    end = policy.config.eos_token_id[0]
    picks = iter([torch.tensor([5, end]), torch.tensor([end])])  # row 1 ends first (and leaves), then row 0
    monkeypatch.setattr(rollout, "draw", lambda logits, temperature, u: next(picks))
    config = rollout.sampling_config(tok, model, 5)
    assert rollout.generate(model, [prompt, prompt[:2]], config) == [[5, end], [end, tok.pad_token_id]]
    # forced lengths (the timing tools): with an end of turn always the likeliest id, it comes at step 4, not 1
    monkeypatch.setattr(rollout, "draw", lambda logits, temperature, u: (logits + 100 * (logits.new_tensor(
        range(logits.shape[-1])) == end)).argmax(-1))
    config.min_new_tokens = 3
    with torch.no_grad():
        assert rollout.generate(model, [prompt], config)[0][3:] == [end]
        config.min_new_tokens = None
        assert rollout.generate(model, [prompt], config) == [[end]]


def test_ended_rows_leave_the_batch_once_half_have_ended_and_the_others_draw_as_before(monkeypatch):
    """4 rows: two end at the first step, so the next steps compute the other two only (their cache rows
    too); one more ends at the third, leaving one. Each row's tokens land in its own row of the result,
    and each step hands the rows still decoding the uniforms they would have had in the whole batch."""
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8)
    config = rollout.sampling_config(tok, model, 6)
    end, pad = config.eos_token_id[0], tok.pad_token_id
    picks = iter([torch.tensor([5, end, end, 6]), torch.tensor([9, 8]), torch.tensor([end, 7]), torch.tensor([end])])
    seen = []  # each step's (rows, uniforms)
    monkeypatch.setattr(rollout, "draw", lambda logits, temperature, u: seen.append((len(logits), u)) or next(picks))
    prompts = [tok.encode("hello there"), tok.encode("a"), tok.encode("b c d"), tok.encode("e f")]
    torch.manual_seed(3)
    with torch.no_grad():
        out = rollout.generate(model, prompts, config)
    assert out == [[5, 9, end, pad], [end, pad, pad, pad], [end, pad, pad, pad], [6, 8, 7, end]]
    assert [rows for rows, _ in seen] == [4, 2, 2, 1]
    torch.manual_seed(3)
    whole = [torch.rand(4, 1, dtype=torch.float64) for _ in range(4)]  # (4, 1) a step, had no row left
    for (_, u), expected, kept in zip(seen, whole, ([0, 1, 2, 3], [0, 3], [0, 3], [3])):
        assert torch.equal(u, expected[kept])
