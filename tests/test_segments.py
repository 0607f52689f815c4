"""Training rows, the batch of rows stage 2 makes, and segment means (METHOD.md, data layout)."""
import pytest
import torch

from segments import (  # noqa: I001
    HINDSIGHT_HEADER,
    Row,
    add_hindsight,
    build_row,
    build_teacher_row,
    generation_prompt_ids,
    length_batches,
    make_rows,
    response_masks,
    shared_prefix_len,
)
from baselines import action_masks, action_token_mask
from speed import collate_rows

MESSAGES = [
    {"role": "system", "content": "You play a text game."},
    {"role": "user", "content": "Your task is to: put a mug in coffeemachine 1."},
    {"role": "assistant", "content": "<think>go</think><action>look</action>"},
    {"role": "user", "content": "You see a countertop 1."},
]


def _chat_template_ids(tok, messages):
    enc = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(enc["input_ids"])


@pytest.mark.parametrize("which", ["tiny_tokenizer", "smollm2_tokenizer"])
def test_row_is_generation_prompt_then_response(which, request):
    """A row = apply_chat_template(add_generation_prompt=True) ids, then the response ids
    unchanged (end-of-turn included); only response tokens carry a segment id."""
    tok = request.getfixturevalue(which)
    response = tok.encode("<think>mug is here</think><action>take mug 1</action>", add_special_tokens=False)
    response = response + [tok.eos_token_id]
    row = build_row(tok, MESSAGES, response)
    prompt = _chat_template_ids(tok, MESSAGES)
    assert row.input_ids[: row.num_prompt] == prompt
    assert row.response_ids == response
    assert row.num_prompt == len(prompt) and row.response_ids == response
    # the generation prompt ends with the assistant header (ChatML on both templates)
    assert tok.decode(prompt[-8:]).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("which", ["tiny_tokenizer", "smollm2_tokenizer"])
def test_teacher_row_aligns_with_student(which, request):
    """The teacher row is the student's context, then the hindsight block as one more user turn,
    then the header and the same response: its response ids and segment ids over the response are
    the student's, and it starts with the student's context ids (up to the assistant header)."""
    tok = request.getfixturevalue(which)
    response = tok.encode("<think>x</think><action>look</action>", add_special_tokens=False) + [tok.eos_token_id]
    student = build_row(tok, MESSAGES, response)
    teacher = build_teacher_row(tok, MESSAGES, response, "This plan succeeded: look")
    assert teacher.response_ids == student.response_ids
    assert teacher.num_prompt > student.num_prompt
    # the shared prefix is the whole student context: only the assistant header (ChatML: "assistant\n"
    # after the turn-start token both rows have) is the student's own
    context = generation_prompt_ids(tok, MESSAGES)[: shared_prefix_len(student, teacher)]
    assert tok.decode(student.input_ids[len(context) : student.num_prompt]).strip() == "assistant"
    assert teacher.input_ids[: len(context)] == context
    assert tok.decode(teacher.input_ids[len(context) : teacher.num_prompt]).startswith(f"user\n{HINDSIGHT_HEADER}")
    msgs = add_hindsight(MESSAGES, "H")
    assert msgs[:-1] == MESSAGES  # every message of the student's context unchanged, in order
    assert msgs[-1] == {"role": "user", "content": f"{HINDSIGHT_HEADER}\nH"}
    assert MESSAGES[1]["content"].startswith("Your task")  # the input was not mutated


def test_shared_prefix_stops_before_either_prompt_ends():
    """The shared prefix is capped one token before the shorter prompt's end, so every response
    token is predicted by a position after it (even when one row's prompt is a prefix of the other's)."""
    a = Row(input_ids=[1, 2, 3, 9, 9], num_prompt=3)
    b = Row(input_ids=[1, 2, 3, 4, 5, 9, 9], num_prompt=5)
    assert shared_prefix_len(a, b) == 2
    c = Row(input_ids=[1, 7, 3, 4, 5, 9, 9], num_prompt=5)
    assert shared_prefix_len(b, c) == 1


def test_add_hindsight_needs_a_user_message():
    """A context without a user message is a clear error, not a silent no-op."""
    with pytest.raises(ValueError, match="no user message"):
        add_hindsight([{"role": "system", "content": "s"}], "h")


def test_collate_and_response_masks(tiny_tokenizer):
    """Right padding keeps every row's ids in place and records where responses start."""
    tok = tiny_tokenizer
    rows = [build_row(tok, MESSAGES[:2], [5, 6, 7]), build_row(tok, MESSAGES, [8])]
    batch = collate_rows(rows, pad_id=tok.pad_token_id)
    for b, r in enumerate(rows):
        n = len(r.input_ids)
        assert batch["input_ids"][b, :n].tolist() == r.input_ids
        assert batch["attention_mask"][b].sum() == n
        assert batch["response_start"][b] == r.num_prompt
        assert batch["response_len"][b] == len(r.response_ids)
    mask = response_masks(batch["response_len"])
    assert mask.tolist() == [[True, True, True], [True, False, False]]


def test_length_batches_put_rows_of_similar_length_together():
    """Every picked row once, none other; micro-batches of at most `size` rows, sorted by length, so
    the padded tokens computed are fewer than in the order the rows came in."""
    lengths = [900, 300, 850, 320, 310, 880, 305, 890, 600]
    rows = [Row(list(range(n)), n - 1) for n in lengths]
    picked = [0, 1, 2, 3, 4, 5, 6, 7]  # row 8 is not picked
    batches = length_batches(picked, rows, 4)
    assert sorted(b for part in batches for b in part) == picked
    assert [len(part) for part in batches] == [4, 4]
    assert [sorted(lengths[b] for b in part) for part in batches] == [[300, 305, 310, 320], [850, 880, 890, 900]]
    padded = lambda parts: sum(max(lengths[b] for b in part) * len(part) for part in parts)  # noqa: E731
    in_order = [picked[s : s + 4] for s in range(0, len(picked), 4)]
    assert padded(batches) == 4 * 320 + 4 * 900 < padded(in_order) == 4 * 900 + 4 * 890
    assert length_batches([], rows, 4) == [] and [len(p) for p in length_batches(list(range(9)), rows, 4)] == [4, 4, 1]


def test_make_rows_cuts_each_step_and_marks_the_response(tiny_tokenizer):
    """Stage 2: one row per step in trajectory order, the ids exactly those fed and sampled, a teacher
    row only where the trajectory has hindsight, and response_mask True on each row's response."""
    from segments import Step, Trajectory, generation_prompt_ids

    tok = tiny_tokenizer
    def step(text):
        msgs = [{"role": "user", "content": text}]
        return Step(msgs, generation_prompt_ids(tok, msgs), tok.encode(text)[:3], text, text, 0.0)
    trajs = [Trajectory("t", 0, "x", [step("go to desk 1"), step("look")]), Trajectory("t", 0, "x", [step("inventory")])]
    rows = make_rows(tok, trajs, ["a plan", None])
    assert rows.traj.tolist() == [0, 0, 1] and rows.has_hindsight.tolist() == [True, True, False]
    assert [r is not None for r in rows.teacher_rows] == [True, True, False]
    assert rows.response_mask.tolist() == [[True] * 3, [True] * len(tok.encode("look")[:3]) + [False] * (
        3 - len(tok.encode("look")[:3])), [True] * 3]
    assert rows.gap_mask is None and not rows.gap_fallback.any()
    trajs[0].steps[0].prompt_ids = trajs[0].steps[0].prompt_ids[1:]  # a prompt the template does not reproduce
    with pytest.raises(ValueError, match="differ from the ids generate was fed"):
        make_rows(tok, trajs, ["a plan", None])


def test_action_only_gap_falls_back_to_the_whole_response_and_says_so(tiny_tokenizer):
    """--gap-tokens action: a response without an <action> block (an invalid answer) is averaged over all
    its tokens, never given a silent gap of 0 (multiplier 1), and marked as a fallback."""
    tok = tiny_tokenizer
    rows = [Row([1] + tok.encode("<think>x</think><action>look</action>"), 1), Row([1] + tok.encode("no tags at all"), 1)]
    mask, fallback = action_masks(tok, rows, 20)
    assert fallback.tolist() == [False, True]
    assert 0 < mask[0].sum() < len(rows[0].response_ids)
    assert mask[1].sum() == len(rows[1].response_ids)


def test_segment_means_by_hand():
    """(The verl bridge's rows may hold several segments.) Means over each segment's tokens; -1 tokens
    ignored; an empty segment gives 0."""
    from verl_bridge.verl_sharpo import segment_means

    values = torch.tensor([[1.0, 3.0, 10.0, 100.0], [2.0, 4.0, 6.0, 8.0]])
    seg = torch.tensor([[0, 0, 2, -1], [-1, -1, -1, -1]])
    out = segment_means(values, seg)
    assert out.shape == (2, 3)
    assert torch.equal(out, torch.tensor([[2.0, 0.0, 10.0], [0.0, 0.0, 0.0]]))
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_segment_means_matches_loop(seed):
    """The vectorized mean equals an obvious Python loop on random ids."""
    from verl_bridge.verl_sharpo import segment_means

    g = torch.Generator().manual_seed(seed)
    B, T, S = 4, 17, 5
    values = torch.randn(B, T, generator=g)
    seg = torch.randint(-1, S, (B, T), generator=g)
    fast = segment_means(values, seg, num_segments=S)
    slow = torch.zeros(B, S)
    for b in range(B):
        for s in range(S):
            picked = [values[b, t].item() for t in range(T) if seg[b, t] == s]
            slow[b, s] = sum(picked) / len(picked) if picked else 0.0
    assert torch.allclose(fast, slow, atol=1e-6)


def test_action_mask_finds_the_action_in_any_case(tiny_tokenizer):
    """--gap-tokens action finds <ACTION>...</Action> as the parser accepts it."""
    ids = tiny_tokenizer.encode("<think>x</think><ACTION>look</Action>")
    mask = action_token_mask(tiny_tokenizer, ids)
    assert any(mask) and not mask[0]
