"""The warm start's rows (tools/warmstart.py) for both envs: what they teach is valid where it is
taught, fits the CPU demo's answer length, and each env's `valid` agrees with what step() penalizes."""
import random

import pytest

from envs import extract_action
from envs.answer import history_length
from envs.make import make_env
from flags import CPU_DEMO_PER_ENV, PRESETS
from segments import EXPERT_HEADLINE, HINDSIGHT_HEADER
from eval import QUERY
from tools.warmstart import expert_rows, reading_check, rewritten_plan


@pytest.fixture(scope="module")
def webshop():
    env = make_env("webshop")
    yield env
    env.close()


def _replay(env, task_id, actions):
    """The state after playing `actions` from the start (each answered in the format)."""
    state = env.reset([task_id])[0]
    for a in actions:
        state = env.step([f"<think>-</think><action>{a}</action>"])[0]
    return state


def test_webshop_valid_agrees_with_what_step_penalizes(webshop):
    """On every state of three goals' expert plans: the expert's answer, each admissible click, a
    filled search, a click on a button that is not on the page and a malformed answer; env.valid
    says valid exactly when step() does not mark the answer invalid."""
    checked = 0
    for task_id in webshop.tasks("train")[:3]:
        plan = webshop.expert_plan(task_id)
        for k in range(len(plan)):
            state = _replay(webshop, task_id, plan[:k])
            answers = [f"<think>x</think><action>{a.replace(QUERY, 'blue shoes')}</action>" for a in state.admissible]
            answers += ["<think>x</think><action>click[no such button]</action>", "click[buy now]",
                        f"<think>x</think><action>{plan[k]}</action>"]
            for text in answers:
                state = _replay(webshop, task_id, plan[:k])
                after = webshop.step([text])[0]
                assert webshop.valid(state, text) == (not after.invalid), (k, text)
                checked += 1
    assert checked > 40


def test_alfworld_valid_agrees_with_what_step_penalizes():
    env = make_env("alfworld")
    try:
        task_id = env.tasks("train")[0]
        state = env.reset([task_id])[0]
        for text in [f"<think>x</think><action>{state.admissible[0]}</action>",
                     "<think>x</think><action>fly to the moon</action>", "go to countertop 1"]:
            assert env.valid(state, text) == (not env.step([text])[0].invalid), text
            state = env.reset([task_id])[0]
    finally:
        env.close()


def test_rewritten_search_is_a_real_search_for_task_words(webshop):
    """WebShop's first step offers only search[<your query>]: the rewritten plan searches three of
    the task's words instead of copying the placeholder (a target no page would accept as meant)."""
    task_id = webshop.tasks("train")[0]
    state = webshop.reset([task_id])[0]
    plan = webshop.expert_plan(task_id)
    other = rewritten_plan(plan, 0, state.admissible, random.Random(0), state.task)
    assert other is not None and other[1:] == plan[1:] and QUERY not in other[0]
    words = other[0][len("search[") : -1].split()
    assert len(words) == 3 and all(w in state.task.split() for w in words)
    assert webshop.valid(state, f"<think>x</think><action>{other[0]}</action>")


def test_webshop_rows_teach_valid_answers_that_fit_the_demo(webshop, smollm2_tokenizer):
    """Every taught answer ends its turn within the WebShop demo's --max-new-tokens (a search
    answer repeats the goal's words); the expert-only headline gives plain, true-plan and
    rewritten rows; every block is the teacher's, after the student's context."""
    tok = smollm2_tokenizer
    rows = expert_rows(webshop, tok, "train", history_length(CPU_DEMO_PER_ENV["webshop"]["history"]), 1, 0,
                       ("expert",))
    cap = CPU_DEMO_PER_ENV["webshop"]["max_new_tokens"]
    assert cap > PRESETS["cpu-demo"]["max_new_tokens"]  # the webshop demo's own cap is in force
    steps = sum(len(webshop.expert_plan(t)) for t in webshop.tasks("train"))
    assert steps * 2 < len(rows) <= steps * 3  # a search step with no other admissible action has none rewritten
    for r in rows:
        response = r.input_ids[r.num_prompt :]
        assert len(response) <= cap and response[-1] == tok.eos_token_id
        text = tok.decode(response[:-1])
        action = extract_action(text)[0]
        assert action is not None and f"The next step is to {action}." in text
    prompts = [tok.decode(r.input_ids[: r.num_prompt]) for r in rows]
    with_block = [p for p in prompts if HINDSIGHT_HEADER in p]
    assert len(with_block) == len(rows) - steps and all(EXPERT_HEADLINE in p for p in with_block)
    assert all(p.index(HINDSIGHT_HEADER) > p.index("Available actions") for p in with_block)


def test_webshop_reading_check_runs_on_the_tiny_model(webshop):
    """The check (--check) on two test goals with the tiny model: it measures both effects and a
    valid rate by the env's own rule (a random-weight model writes no valid answer)."""
    from infra.models import load_policy

    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=0, dtype="fp32")
    model.eval()
    out = reading_check(model, tok, webshop, webshop.tasks("test")[:2], history_length("1"), steps_per_game=2)
    assert out["games"] == 2 and out["states"] == 4
    assert out["on_plan"] != 0 and out["off_plan"] != 0 and out["valid_rate"] == 0.0


def test_row_batches_cover_every_row_once_and_by_length_groups_similar_rows():
    """Each epoch's batches hold every row once; by length, each batch spans a contiguous run of
    the sorted lengths (so little padding), in shuffled batch order; without it, the order is the
    plain reshuffle of the previous epoch's order (the shipped ALFWorld warm starts were made so)."""
    from segments import Row
    from tools.warmstart import row_batches

    rows = [Row([1] * n, n - 1) for n in random.Random(1).choices(range(5, 900), k=41)]
    random.seed(0)
    order = list(range(len(rows)))
    batches = row_batches(rows, order, 4, True)
    assert sorted(i for b in batches for i in b) == list(range(41))
    ranked = sorted(len(r.input_ids) for r in rows)
    spans = sorted((min(len(rows[i].input_ids) for i in b), max(len(rows[i].input_ids) for i in b)) for b in batches)
    assert all(hi <= spans[k + 1][0] for k, (_, hi) in enumerate(spans[:-1]))  # batches do not interleave
    assert [len(rows[i].input_ids) for b in batches for i in b] != ranked  # the batches themselves are shuffled
    random.seed(0)
    plain_order = list(range(len(rows)))
    epochs = [[i for b in row_batches(rows, plain_order, 4, False) for i in b] for _ in range(2)]
    expected = list(range(41))
    random.seed(0)
    for epoch in epochs:
        random.shuffle(expected)
        assert epoch == expected


def test_check_base_measures_the_model_without_an_adapter_and_training_refuses_held_out_games(monkeypatch):
    """`--check base` is the no-warm-start control: the policy loads with no adapter (the CLI's
    `none` means "no value", so it cannot name the control); training on a held-out split is
    refused before any model loads."""
    import tools.warmstart as ws
    from infra.cli import UserError

    loaded = []

    class Stop(Exception):
        pass

    def fake_load(name, init_adapter=None, **kw):
        loaded.append(init_adapter)
        raise Stop

    monkeypatch.setattr(ws, "load_policy", fake_load)
    with pytest.raises(Stop):
        ws.main(["--model", "tiny", "--check", "base", "--split", "test", "--env", "webshop"])
    with pytest.raises(Stop):
        ws.main(["--model", "tiny", "--check", "data/warmstart/smollm2-webshop", "--split", "test", "--env", "webshop"])
    assert loaded == [None, "data/warmstart/smollm2-webshop"]
    with pytest.raises(UserError, match="train only"):
        ws.main(["--model", "tiny", "--split", "test", "--env", "webshop"])
    with pytest.raises(UserError, match="train only"):
        ws.main(["--model", "tiny", "--check", "none", "--split", "valid_seen"])
    assert len(loaded) == 2


@pytest.mark.parametrize("epochs", ["0", "-1"])
def test_a_warm_start_of_no_epochs_is_refused(epochs, tmp_path):
    """--epochs 0 or -1 wrote an untrained adapter as a warm start and exited 0."""
    import tools.warmstart as ws
    from infra.cli import UserError

    with pytest.raises(UserError, match=f"--epochs must be > 0; got {epochs}"):
        ws.main(["--model", "tiny", "--env", "webshop", "--tasks", "1", "--epochs", epochs, "--out", str(tmp_path / "w")])
    assert not (tmp_path / "w").exists()


def test_the_warm_start_s_out_refusal_speaks_of_its_own_output(tmp_path):
    """A --out that cannot take the adapter: the refusal names the adapter's file and --out, not eval.py's
    JSON and checkpoint."""
    import tools.warmstart as ws
    from infra.cli import UserError

    (tmp_path / "a-file").write_text("taken")
    with pytest.raises(UserError) as err:
        ws.main(["--model", "tiny", "--env", "webshop", "--out", str(tmp_path / "a-file")])
    assert "a-file/adapter_config.json" in str(err.value) and str(err.value).endswith("pass another --out")
    assert "JSON" not in str(err.value) and "checkpoint" not in str(err.value)
