"""The log-prob passes: rollout.py's plain ones (one forward per row) and speed.py's fast ones (batched,
the teacher continuing the student's context cache, the head in chunks) give the same numbers, and
bf16 computes what float32 does, within its precision (METHOD.md sections 2 and 5)."""
import pytest
import torch

import rollout
import speed
from infra.models import load_policy
from segments import Rows, build_row, build_teacher_row, response_masks
from speed import FastPath

torch.set_num_threads(1)

# contexts of different lengths (so the shared prefixes are left-padded by different amounts),
# responses of different lengths, hindsight blocks of different lengths
CONTEXTS = [
    [{"role": "user", "content": "Your task is to: put a mug in coffeemachine 1."}],
    [{"role": "system", "content": "You play a text game."},
     {"role": "user", "content": "Your task is to: clean a knife and put it in drawer 2. You see a sinkbasin 1, a drawer 2."},
     {"role": "assistant", "content": "<think>go</think><action>go to sinkbasin 1</action>"},
     {"role": "user", "content": "You arrive at sinkbasin 1. On it, you see a knife 1."}],
    [{"role": "user", "content": "Task: look. Observation: you are in the middle of a room."}],
]
RESPONSES = ["<think>the mug</think><action>take mug 1 from countertop 1</action>", "<think>x</think><action>look</action>",
             "<think>I should go to the cabinet first and open it</think><action>go to cabinet 1</action>"]
BLOCKS = ["1. go to countertop 1\n2. take mug 1 from countertop 1", "1. look", "1. go to cabinet 1\n2. open cabinet 1\n3. look"]


def tiny_with_lora(seed):
    """The tiny model with a LoRA that is not zero, so the adapter's path is in the comparison too."""
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    return model.eval(), tok


def rows_and_teacher_rows(tok):
    responses = [tok.encode(r, add_special_tokens=False) + [tok.eos_token_id] for r in RESPONSES]
    rows = [build_row(tok, m, r) for m, r in zip(CONTEXTS, responses)]
    teacher_rows = [build_teacher_row(tok, m, r, h) for m, r, h in zip(CONTEXTS, responses, BLOCKS)]
    return rows, teacher_rows


@pytest.mark.parametrize("micro_batch_rows", [1, 2, 3])
def test_cached_logprobs_equal_a_plain_forward_over_the_full_rows(micro_batch_rows):
    """Student and teacher log-probs from one pass over the shared context (left-padded rows of
    different lengths, the teacher continuing from the cache) equal the plain forward over each
    full row, float32, atol 1e-4; rows left out stay 0."""
    model, tok = tiny_with_lora(seed=1)
    rows, teacher_rows = rows_and_teacher_rows(tok)
    T = max(len(r.response_ids) for r in rows)
    student = torch.tensor([True, True, True])
    taught = torch.tensor([True, False, True])
    fast = FastPath(tok.pad_token_id, micro_batch_rows)
    logp_s, logp_t = fast.student_teacher_logprobs(model, rows=as_rows(rows, teacher_rows), student=student,
                                                   taught=taught)
    full_s = FastPath(tok.pad_token_id, 1).pass_logprobs(model, rows=rows, T=T)
    full_t = FastPath(tok.pad_token_id, 1).pass_logprobs(model, rows=teacher_rows, T=T)
    assert torch.allclose(logp_s, full_s, atol=1e-4, rtol=0), (logp_s - full_s).abs().max()
    assert torch.allclose(logp_t[taught], full_t[taught], atol=1e-4, rtol=0), (logp_t - full_t)[taught].abs().max()
    assert logp_t[~taught].abs().sum() == 0  # not asked: not computed
    assert (logp_s != 0).sum() == sum(len(r.response_ids) for r in rows)  # every response token scored, no padding
    assert (full_t[taught] - full_s[taught]).abs().max() > 1e-3  # the block changes the log-probs: the test can fail


def test_the_teacher_only_runs_on_rows_the_student_pass_computed():
    """A taught row outside the student rows is refused (it would read a cache that was never
    made); rows outside `student` stay 0."""
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8)
    rows, teacher_rows = rows_and_teacher_rows(tok)
    fast, batch = FastPath(tok.pad_token_id, 2), as_rows(rows, teacher_rows)
    with pytest.raises(ValueError, match="taught row must also be a student row"):
        fast.student_teacher_logprobs(model, rows=batch, student=torch.tensor([True, False, True]),
                                      taught=torch.tensor([False, True, False]))
    logp_s, logp_t = fast.student_teacher_logprobs(model, rows=batch, student=torch.tensor([True, False, True]),
                                                   taught=torch.tensor([True, False, False]))
    assert logp_s[1].abs().sum() == 0 and logp_t[1:].abs().sum() == 0
    assert logp_s[0].abs().sum() > 0 and logp_t[0].abs().sum() > 0


def test_bf16_weights_keep_the_lora_in_float32_and_score_in_float32():
    """--dtype bf16: the base weights are bf16, the trained LoRA weights float32, the log-probs
    float32, and they agree with float32's within bf16's precision (cached and plain alike)."""
    fp32, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=1, dtype="fp32")
    bf16, _ = load_policy("tiny", lora_r=4, lora_alpha=8, seed=1, dtype="bf16")
    kinds = {p.dtype for n, p in bf16.named_parameters() if "lora_" not in n}
    assert kinds == {torch.bfloat16}
    assert {p.dtype for p in bf16.parameters() if p.requires_grad} == {torch.float32}
    rows, teacher_rows = rows_and_teacher_rows(tok)
    T = max(len(r.response_ids) for r in rows)
    every = torch.ones(3, dtype=torch.bool)
    fast, batch = FastPath(tok.pad_token_id, 2), as_rows(rows, teacher_rows)
    ref_s, ref_t = fast.student_teacher_logprobs(fp32, rows=batch, student=every, taught=every)
    got_s, got_t = fast.student_teacher_logprobs(bf16, rows=batch, student=every, taught=every)
    plain = rollout.pass_logprobs(bf16, rows=rows, T=T)
    assert got_s.dtype == torch.float32
    assert (got_s - ref_s).abs().max() < 0.05 and (got_t - ref_t).abs().max() < 0.05
    assert (got_s - plain).abs().max() < 0.05
    assert (got_s - ref_s).abs().max() > 0  # bf16 did run: the figures are not float32's


def as_rows(rows, teacher_rows) -> Rows:
    """A Rows container around hand-built rows (one trajectory each, no gap mask)."""
    lengths = torch.tensor([len(r.response_ids) for r in rows])
    B = len(rows)
    return Rows(torch.arange(B), [None] * B, rows, teacher_rows, response_masks(lengths), None,
                torch.zeros(B, dtype=torch.bool), torch.tensor([t is not None for t in teacher_rows]))


def test_plain_and_fast_logprobs_are_equal():
    """rollout.py's plain passes and speed.py's fast ones, behind the same calls, give the same
    student, teacher and reference log-probs to 1e-5 in float32: on rows whose contexts differ
    tenfold in length (the fast pass left-pads the short ones by hundreds of tokens), rows left out
    of the student pass, rows without a teacher row and rows with one that is not asked for. The
    update's pass (with gradient) gives the same values and the same gradients."""
    model, tok = tiny_with_lora(seed=2)
    long_history = [{"role": "user", "content": f"You arrive at cabinet {k}. The cabinet {k} is closed."}
                    if k % 2 else {"role": "assistant", "content": f"<action>go to cabinet {k}</action>"}
                    for k in range(1, 40)]
    contexts = CONTEXTS + [long_history, [{"role": "user", "content": "look"}]]
    responses = RESPONSES + ["<action>open cabinet 3</action>", "<think>a much longer thought " * 5 + "</think>"]
    blocks = BLOCKS + ["1. open cabinet 3", None]
    ids = [tok.encode(r, add_special_tokens=False) + [tok.eos_token_id] for r in responses]
    rows = [build_row(tok, m, r) for m, r in zip(contexts, ids)]
    teacher_rows = [None if h is None else build_teacher_row(tok, m, r, h) for m, r, h in zip(contexts, ids, blocks)]
    lengths = [len(r.input_ids) for r in rows]
    assert max(lengths) > 10 * min(lengths)  # the test can see a padding mistake
    batch = as_rows(rows, teacher_rows)
    student = torch.tensor([True, True, False, True, True])
    taught = torch.tensor([True, False, False, True, False])  # row 1 has a teacher row, not asked; row 4 has none
    fast = FastPath(tok.pad_token_id, micro_batch_rows=3)
    plain_s, plain_t = rollout.student_teacher_logprobs(model, rows=batch, student=student, taught=taught)
    fast_s, fast_t = fast.student_teacher_logprobs(model, rows=batch, student=student, taught=taught)
    assert (plain_s - fast_s).abs().max() < 1e-5 and (plain_t - fast_t).abs().max() < 1e-5
    assert plain_s[2].abs().sum() == 0 and plain_t[~taught].abs().sum() == 0  # not asked: not computed
    assert (plain_s != 0).sum() == sum(len(rows[b].response_ids) for b in range(5) if student[b])
    assert (plain_t[taught] - plain_s[taught]).abs().max() > 1e-3  # the block changes the log-probs
    T = batch.response_mask.shape[1]
    with model.disable_adapter():
        ref_plain = rollout.pass_logprobs(model, rows=rows, T=T, temperature=1.0, only=student)
        ref_fast = fast.pass_logprobs(model, rows=rows, T=T, temperature=1.0, only=student)
    assert (ref_plain - ref_fast).abs().max() < 1e-5 and (ref_plain - plain_s).abs().max() > 1e-4
    grads = []
    for way in (rollout, fast):
        model.zero_grad()
        logp = way.micro_batch_logprobs(model, rows=rows, temperature=0.7)  # (b, t) with gradient, at another temperature
        logp.sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
        grads[-1]["logp"] = logp.detach()
    assert (grads[0]["logp"] - grads[1]["logp"]).abs().max() < 1e-5
    assert all(torch.allclose(grads[0][n], grads[1][n], atol=1e-5, rtol=1e-4) for n in grads[0])


def test_student_rows_with_one_context_compute_it_once():
    """A group's first step: its episodes' rows share their context. In one micro-batch, three taught rows
    with one context, one with another, and two untaught rows with a third (an untaught row's context runs
    to its prompt's last token): the pass over the contexts runs on 3 rows, not 6, and every student and
    teacher log-prob, and every input kept for the update at the first trained layer, equals what a row
    alone gives (float32, 1e-5)."""
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, lora_layers=1, seed=3)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    model.eval()
    contexts = [CONTEXTS[0]] * 3 + [CONTEXTS[1]] + [CONTEXTS[2]] * 2
    responses = RESPONSES + [RESPONSES[0], RESPONSES[1], RESPONSES[2]]
    blocks = BLOCKS + [BLOCKS[0], None, None]
    ids = [tok.encode(r, add_special_tokens=False) + [tok.eos_token_id] for r in responses]
    rows = [build_row(tok, m, r) for m, r in zip(contexts, ids)]
    teacher_rows = [None if h is None else build_teacher_row(tok, m, r, h) for m, r, h in zip(contexts, ids, blocks)]
    batch, student = as_rows(rows, teacher_rows), torch.ones(6, dtype=torch.bool)
    taught = torch.tensor([True, True, True, True, False, False])
    sizes = []  # the batch of each call into the decoder's first layer
    hook = model.get_decoder().layers[0].register_forward_pre_hook(lambda m, args: sizes.append(args[0].shape[0]))
    try:
        together = FastPath(tok.pad_token_id, micro_batch_rows=6)
        fast_s, fast_t = together.student_teacher_logprobs(model, rows=batch, student=student, taught=taught)
    finally:
        hook.remove()
    assert sizes == [3, 3, 4]  # the contexts; the other rows' tails; the teacher rows' tails
    alone = FastPath(tok.pad_token_id, micro_batch_rows=1)
    alone_s, alone_t = alone.student_teacher_logprobs(model, rows=batch, student=student, taught=taught)
    plain_s, plain_t = rollout.student_teacher_logprobs(model, rows=batch, student=student, taught=taught)
    for got, want in ((fast_s, plain_s), (fast_t, plain_t), (alone_s, plain_s), (alone_t, plain_t)):
        assert (got - want).abs().max() < 1e-5, (got - want).abs().max()
    assert (plain_s != 0).sum() == sum(len(r.response_ids) for r in rows) and plain_t[4:].abs().sum() == 0
    assert (plain_s[0] - plain_s[1]).abs().max() > 1e-3  # one context, other responses: the test can fail
    assert set(together.kept) == set(alone.kept) == {id(r) for r in rows}
    for r in rows:
        kept, single = together.kept[id(r)][1], alone.kept[id(r)][1]
        assert kept.shape == single.shape == (len(r.input_ids), kept.shape[-1])
        assert torch.allclose(kept, single, atol=1e-5, rtol=0), (kept - single).abs().max()


def test_the_plain_path_trains_as_the_fast_one(tmp_path):
    """One tiny iteration with --plain: the same episodes (the rollout does not depend on the path),
    the same gaps and multipliers to 1e-5, and the same update to float rounding (Adam's first steps
    turn rounding-sized gradient differences into step-sized ones, hence 1e-3 relative)."""
    from tiny_runs import tiny_args, tiny_train

    lines = [tiny_train(tiny_args(tmp_path / name, iterations=1, **kw))[0][0]
             for name, kw in (("fast", {}), ("plain", {"plain": True}))]
    assert lines[0]["mean_reward"] == lines[1]["mean_reward"] and lines[0]["rows"] == lines[1]["rows"]
    for key in ("gap_mean", "gap_abs_mean", "mult_mean", "mult_std"):
        assert lines[0][key] == pytest.approx(lines[1][key], abs=1e-5), key
    for key in ("update/loss", "update/pg_loss"):
        assert lines[0][key] == pytest.approx(lines[1][key], rel=1e-3), key
    assert lines[0]["update/kl_ref"] == pytest.approx(lines[1]["update/kl_ref"], rel=1e-2)  # a small difference


def test_the_update_starting_at_the_first_trained_layer_computes_the_whole_pass():
    """With LoRA on the last layer only, the update's pass that starts from the student pass's kept
    inputs to that layer gives the whole pass's log-probs and LoRA gradients (float32, 1e-5): the
    layers below hold no trained weight. A row the student pass did not score takes the whole pass."""
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, lora_layers=1, seed=1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    rows, teacher_rows = rows_and_teacher_rows(tok)
    fast = FastPath(tok.pad_token_id, 2)
    fast.student_teacher_logprobs(model.eval(), rows=as_rows(rows, teacher_rows),
                                  student=torch.tensor([True, True, False]), taught=torch.tensor([True, False, False]))
    assert speed.first_trained_layer(model) == 1 and set(fast.kept) == {id(rows[0]), id(rows[1])}

    def pass_and_grads(passes, batch):
        model.zero_grad()
        logp = passes.micro_batch_logprobs(model, rows=batch)  # (b, t)
        logp.sum().backward()
        return logp.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]

    started, grads = pass_and_grads(fast, rows[:2])
    L = max(len(r.input_ids) for r in rows)
    assert fast.kept_input(rows[:2], L, "cpu") is not None  # the kept inputs were used
    whole, whole_grads = pass_and_grads(FastPath(tok.pad_token_id, 2), rows[:2])
    assert torch.allclose(started, whole, atol=1e-5, rtol=0), (started - whole).abs().max()
    assert all(torch.allclose(g, w, atol=1e-5, rtol=0) for g, w in zip(grads, whole_grads))
    assert fast.kept_input(rows, L, "cpu") is None  # the third row was not kept: the whole pass
    with torch.no_grad():  # the test can fail: other inputs at that layer give other log-probs
        kept = fast.kept[id(rows[0])][1]
        kept.mul_(1.5)
        assert (fast.micro_batch_logprobs(model, rows=rows[:2]) - whole).abs().max() > 1e-3


def test_the_kl_and_its_gradient_are_exactly_zero_before_any_step_from_kept_inputs():
    """With LoRA on the last layer only and nothing moved yet (lora_B = 0), train.py's reference pass
    (the adapter off, no gradient) and the update's pass (the adapter on) start from the same kept
    inputs, so the KL of Eq. 7 and its gradient are exactly 0, as on the whole pass. A reference that
    took the whole pass would differ by the kept inputs' rounding (~1e-6 on some CPUs): a KL gradient
    of ~1e-8 that AdamW turns into lr-sized steps where nothing should move."""
    from types import SimpleNamespace

    import train
    from advantage import kl_loss

    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, lora_layers=1, seed=1)
    rows, teacher_rows = rows_and_teacher_rows(tok)
    fast, every = FastPath(tok.pad_token_id, 2), torch.tensor([True, True, True])
    fast.student_teacher_logprobs(model.eval(), rows=as_rows(rows, teacher_rows), student=every, taught=every)
    for _, states in fast.kept.values():  # kept inputs equal a whole pass's to rounding, on some CPUs
        states.mul_(1 + 1e-5)  # not to the last bit: here surely not
    model.train()  # as in the update
    trainer = SimpleNamespace(args=SimpleNamespace(kl_coef=0.01, temperature=1.0), model=model, passes=fast)
    logp_ref = train.Trainer.reference(trainer, rows)  # (b, t)
    logp_new = fast.micro_batch_logprobs(model, rows=rows)  # (b, t)
    mask = response_masks(torch.tensor([len(r.response_ids) for r in rows]))[:, : logp_new.shape[1]]
    kl = kl_loss(logp_ref, logp_new, mask, int(mask.sum()))
    kl.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert set(fast.kept) == {id(row) for row in rows}  # the update's pass starts from the kept inputs
    assert kl.item() == 0.0
    assert all(g is None or not g.any() for g in grads), max(float(g.abs().max()) for g in grads if g is not None)
