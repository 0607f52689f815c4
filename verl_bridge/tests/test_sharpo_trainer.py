"""verl_bridge/sharpo_trainer.py through verl 0.9.1 itself, on a CPU: a real Ray worker group of
verl's actor worker over its FSDP2 engine (cpu_verl.py beside this file bridges the CPU's gaps), a
tiny random Qwen2 with a small byte-level BPE tokenizer and a ChatML chat template, the hindsight
block as one more chat turn.

The module fixture starts Ray and the worker group once (~15 s on 2 cores), runs the trainer's
teacher pass on a batch in verl's multi-turn layout (one sample a trajectory), then one
`_update_actor` step on a batch in verl-agent's layout (one sample a step); the tests read what
each did. The step batch:
  - group "a": a 2-step win, a loss, a loss with an invalid action: the two losses get the win's
    actions as hindsight; the win, its group's only success, gets none;
  - group "b": a loss and a loss with an invalid action, no success: A != 0, no hindsight;
  - group "c": two tied losses, with the env's plan: hindsight, but A = 0.
"""
from __future__ import annotations

import numpy as np
import pytest
import ray
import torch
import verl.trainer.config as verl_config
from hydra import compose, initialize_config_dir
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from verl import DataProto
from verl.utils.model import compute_position_id_with_mask

from segments import EXPERT_HEADLINE, SIBLING_HEADLINE, add_hindsight, format_plan
from verl_bridge.sharpo_trainer import (SharpoRayPPOTrainer, SharpoSettings, hindsight_blocks, hindsight_turn,
                                        teacher_prompt_ids)
from verl_bridge.tests import cpu_verl  # conftest.py imported it first: verl's platform is the CPU
from verl_bridge.verl_sharpo import advantages_and_segments

CHATML = (  # Qwen2.5's turn format; a default system turn when none is given
    "{%- if messages[0]['role'] != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CORPUS = """You are in the middle of a room. Your task is to: put a clean mug in coffeemachine.
You arrive at countertop 1. On the countertop 1, you see a mug 1, an apple 2, and a knife 1.
<think>The mug is on the countertop.</think><action>take mug 1 from countertop 1</action>
go to open close move to clean with sinkbasin fridge cabinet drawer look inventory
Hindsight (information you did not have when you acted): Another attempt at this same task
succeeded with these actions: The expert's plan for this task, from the start: 1. 2. 3."""


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE (any text encodes) over 512 ids, ChatML's special tokens, the template above."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([CORPUS] * 4, trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHATML)


def save_tiny_model(folder, tokenizer) -> None:
    """A random 2-layer Qwen2 (hidden 64) over the tokenizer, saved with it as a model folder."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def verl_config_for(model_dir, batch_size: int):
    """verl's own ppo_trainer config (hydra), set for one CPU process: FSDP2 in float32, eager
    attention, one optimizer step over the whole batch, a step large enough to see."""
    with initialize_config_dir(config_dir=str(verl_config.__path__[0]), version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            f"actor_rollout_ref.model.path={model_dir}",
            "+actor_rollout_ref.model.override_config.attn_implementation=eager",
            "actor_rollout_ref.actor.strategy=fsdp2",
            "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
            "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype: fp32, reduce_dtype: fp32, "
            "buffer_dtype: fp32}",
            "actor_rollout_ref.actor.use_torch_compile=False",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={batch_size}",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.optim.lr=1e-3",
            "actor_rollout_ref.actor.optim.weight_decay=0.0",
            "algorithm.adv_estimator=grpo",
            "trainer.balance_batch=False",
            "+sharpo.layout=per_step",
        ])


# verl-agent's layout, one sample a step: (group, trajectory, score, response text or None, env plan).
# A None response is 6 token ids of the sample's own, in no other response: shared tokens (chat
# tags, the end token) move with the whole batch's net advantage in one step, a sample's own tokens
# with its own. The 2-step win's responses hold its actions, the siblings' hindsight.
SAMPLES = [
    ("a", "a1", 10.0, "<think>The mug.</think><action>take mug 1 from countertop 1</action>", None),
    ("a", "a1", 10.0, "<think>Now the machine.</think><action>move mug 1 to coffeemachine 1</action>", None),
    ("a", "a2", 0.0, None, None),
    ("a", "a3", -0.1, None, None),
    ("b", "b1", 0.0, None, None),
    ("b", "b2", -0.1, None, None),
    ("c", "c1", 0.0, None, ["go to drawer 1", "open drawer 1"]),
    ("c", "c2", 0.0, None, ["go to drawer 1", "open drawer 1"]),
]
TASKS = {"a": "Your task is to: put a clean mug in coffeemachine. You arrive at countertop 1.",
         "b": "Your task is to: cool some apple and put it in fridge.",
         "c": "Your task is to: look at the drawer."}


def left_padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """rows as one (n, L) tensor, left-padded, and its mask (1 = a real id)."""
    L = max(map(len, rows))
    ids, mask = torch.full((len(rows), L), pad_id), torch.zeros(len(rows), L, dtype=torch.long)  # (n, L)
    for k, row in enumerate(rows):
        ids[k, L - len(row):], mask[k, L - len(row):] = torch.tensor(row), 1
    return ids, mask


def verl_batch(tokenizer, prompts: list[list[int]], responses: list[list[int]], sampled: list[list[int]],
               scores: list[float], non_tensors: dict) -> DataProto:
    """A batch as verl's rollout leaves it: prompts left-padded, responses right-padded, the
    response mask (`sampled`: 1 = a generated token, 0 = an environment token), each score on its
    response's last token."""
    prompt_ids, prompt_mask = left_padded(prompts, tokenizer.pad_token_id)  # (B, Lp)
    B, T = len(responses), max(map(len, responses))
    response_ids = torch.full((B, T), tokenizer.pad_token_id)  # (B, T)
    attention, response_mask, rewards = (torch.zeros(B, T, dtype=torch.long) for _ in range(3))  # (B, T) each
    rewards = rewards.float()
    for b, (ids, mask) in enumerate(zip(responses, sampled)):
        response_ids[b, :len(ids)], attention[b, :len(ids)] = torch.tensor(ids), 1
        response_mask[b, :len(ids)], rewards[b, len(ids) - 1] = torch.tensor(mask), scores[b]
    attention = torch.cat([prompt_mask, attention], dim=1)  # (B, Lp + T)
    return DataProto.from_dict(
        tensors={"prompts": prompt_ids, "responses": response_ids, "input_ids": torch.cat([prompt_ids, response_ids], 1),
                 "attention_mask": attention, "position_ids": compute_position_id_with_mask(attention),
                 "response_mask": response_mask, "token_level_rewards": rewards},
        non_tensors={k: np.array(v, dtype=object) for k, v in non_tensors.items()},
        meta_info={"temperature": 1.0, "global_token_num": attention.sum(-1).tolist()})


def chat_prompt(tokenizer, task: str) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": task}],
                                                          add_generation_prompt=True, tokenize=False),
                            add_special_tokens=False)


def student_batch(tokenizer) -> DataProto:
    """SAMPLES in verl's padded layout."""
    texts = [tokenizer.encode(text, add_special_tokens=False) if text else [] for _, _, _, text, _ in SAMPLES]
    used = {i for ids in texts for i in ids}
    free = [i for i in torch.randperm(len(tokenizer), generator=torch.Generator().manual_seed(0)).tolist()
            if i not in used and i not in tokenizer.all_special_ids]  # ids no written response holds
    responses = [ids or free[6 * b: 6 * b + 6] for b, ids in enumerate(texts)]
    plans = np.empty(len(SAMPLES), dtype=object)
    plans[:] = [plan for *_, plan in SAMPLES]  # lists of different lengths, kept as objects
    return verl_batch(tokenizer, [chat_prompt(tokenizer, TASKS[s[0]]) for s in SAMPLES], responses,
                      [[1] * len(r) for r in responses], [s[2] for s in SAMPLES],
                      {"uid": [s[0] for s in SAMPLES], "traj_uid": [s[1] for s in SAMPLES], "expert_plan": plans})


def trajectory_batch(tokenizer) -> DataProto:
    """verl's multi-turn layout, one sample a trajectory of one group: two turns of the model with the
    environment's reply between them (response_mask 0 there); the first trajectory won. (Four:
    verl's workers take whole micro-batches, 4 samples here.)"""
    def turn(text):
        return tokenizer.encode(text, add_special_tokens=False)
    env = turn("<|im_end|>\n<|im_start|>user\nYou arrive at fridge 1.<|im_end|>\n<|im_start|>assistant\n")
    first = [turn("<think>Go.</think><action>go to fridge 1</action>"), turn("<action>look</action>"),
             turn("<action>open drawer 1</action>"), turn("go to")]
    second = [turn("<action>open fridge 1</action>"), turn("inventory"), turn("<action>close</action>"),
              turn("<action>examine fridge 1</action>")]
    responses = [a + env + b for a, b in zip(first, second)]
    sampled = [[1] * len(a) + [0] * len(env) + [1] * len(b) for a, b in zip(first, second)]
    return verl_batch(tokenizer, [chat_prompt(tokenizer, TASKS["b"])] * 4, responses, sampled,
                      [10.0, 0.0, -0.1, 0.0], {"uid": ["b"] * 4})


def plain_log_probs(model, input_ids: list[int], T: int) -> torch.Tensor:
    """log p(token t | tokens before it) over the last T ids of one unpadded row: a plain forward. (T,)"""
    with torch.no_grad():
        logits = model(torch.tensor([input_ids])).logits[0].float()  # (L, V)
    logp = torch.log_softmax(logits[:-1], dim=-1)  # (L-1, V): position t predicts token t + 1
    return logp.gather(1, torch.tensor(input_ids[1:])[:, None])[-T:, 0]  # (T,)


class RecordingTrainer(SharpoRayPPOTrainer):
    """The trainer under test, recording each batch its log-prob pass is given and what it returned."""

    def _compute_old_log_prob(self, batch):
        scored, mfu = super()._compute_old_log_prob(batch)
        self.passes.append((batch, scored))
        return scored, mfu


def with_old_log_probs(trainer, batch: DataProto) -> DataProto:
    """batch with verl's old_log_probs, as its PPO step adds them before the update."""
    old, _ = trainer._compute_old_log_prob(batch)
    old.batch.pop("entropys")  # fit() logs it and drops it
    return batch.union(old)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The SHARPO trainer through a real worker group: a teacher pass on verl's multi-turn layout,
    then one `_update_actor` step on verl-agent's; what each did."""
    tokenizer = tiny_tokenizer()
    folder = tmp_path_factory.mktemp("tiny_qwen2")
    save_tiny_model(folder, tokenizer)
    steps, trajectories = student_batch(tokenizer), trajectory_batch(tokenizer)
    config = verl_config_for(folder, len(steps))
    cpu_verl.start_ray()
    # RayPPOTrainer.__init__ builds datasets from parquet files and init_workers starts rollout
    # servers (vLLM), neither of which these steps use: the trainer gets its parts by hand.
    trainer = RecordingTrainer.__new__(RecordingTrainer)
    trainer.config, trainer.tokenizer, trainer.passes = config, tokenizer, []
    trainer.actor_rollout_wg = cpu_verl.actor_worker_group(config.actor_rollout_ref)

    trajectories = with_old_log_probs(trainer, trajectories)
    trainer.passes.clear()
    logp_trajectories, _ = trainer._teacher_log_probs(trajectories, SharpoSettings(layout="per_trajectory"))
    trajectory_passes = list(trainer.passes)

    steps = with_old_log_probs(trainer, steps)
    trainer.passes.clear()
    A, _ = advantages_and_segments(steps, "per_step", "token_level_rewards", "response_mask", "trajectory")  # (B,)
    output = trainer._update_actor(steps)  # sets steps.batch["advantages"] to Ahat
    step_passes = list(trainer.passes)
    after, _ = trainer._compute_old_log_prob(steps)  # the updated policy on the same samples
    yield dict(tokenizer=tokenizer, model=AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
               steps=steps, A=A, step_passes=step_passes, metrics=output.meta_info["metrics"],
               logp_after=after.batch["old_log_probs"], trajectories=trajectories,
               trajectory_passes=trajectory_passes, logp_trajectories=logp_trajectories)
    ray.shutdown()


def test_hindsight_blocks_follow_the_sibling_rule_and_the_env_plan():
    """Group a: the losses get the 2-step win's actions, the win (its group's one success) none;
    group b has no success, none; group c's samples get the env's plan. Per trajectory, the losers
    get the winner's actions, one a turn."""
    tokenizer = tiny_tokenizer()
    blocks = hindsight_blocks(student_batch(tokenizer), tokenizer, SharpoSettings())
    win = format_plan(SIBLING_HEADLINE, ["take mug 1 from countertop 1", "move mug 1 to coffeemachine 1"])
    plan = format_plan(EXPERT_HEADLINE, ["go to drawer 1", "open drawer 1"])
    assert blocks == [None, None, win, win, None, None, plan, plan]
    blocks = hindsight_blocks(trajectory_batch(tokenizer), tokenizer, SharpoSettings(layout="per_trajectory"))
    win = format_plan(SIBLING_HEADLINE, ["go to fridge 1", "open fridge 1"])
    assert blocks == [None, win, win, win]


def test_a_plan_given_as_a_string_is_refused_not_read_letter_by_letter():
    """An env plan written as one string became a block of one action a letter."""
    tokenizer = tiny_tokenizer()
    batch = student_batch(tokenizer)
    batch.non_tensor_batch["expert_plan"][6] = "go to drawer 1"
    with pytest.raises(ValueError, match="is a string.*list of actions"):
        hindsight_blocks(batch, tokenizer, SharpoSettings())


def test_the_teacher_prompt_is_the_chat_template_with_one_more_turn():
    """The spliced teacher prompt equals the template rendering the task with the hindsight turn
    (segments.add_hindsight), token for token; a prompt without the assistant header is refused."""
    tokenizer = tiny_tokenizer()
    task = [{"role": "user", "content": TASKS["a"]}]
    block = format_plan(SIBLING_HEADLINE, ["look", "go to fridge 1"])
    want = tokenizer.encode(tokenizer.apply_chat_template(add_hindsight(task, block), add_generation_prompt=True,
                                                          tokenize=False), add_special_tokens=False)
    header, turn = hindsight_turn(tokenizer, block)
    assert teacher_prompt_ids(chat_prompt(tokenizer, TASKS["a"]), header, turn, tokenizer) == want
    with pytest.raises(ValueError, match="assistant header"):
        teacher_prompt_ids(chat_prompt(tokenizer, TASKS["a"])[:-2], header, turn, tokenizer)


def unique_rows(passed: DataProto) -> set:
    """The distinct (prompt, response) rows of a log-prob pass (its batch is padded by repeats)."""
    ids, mask = passed.batch["input_ids"], passed.batch["attention_mask"].bool()
    return {tuple(ids[k][mask[k]].tolist()) for k in range(len(passed))}


def test_only_moving_samples_with_hindsight_go_to_the_teacher(run):
    """One teacher pass, over samples 2 and 3 (group a's losses): the win has no hindsight, group b
    none, group c has the env's plan but A = 0 there. Each teacher row is its sample's response,
    unchanged, after the hindsight prompt; the pass was padded to whole micro-batches by repeats."""
    A, steps, tokenizer = run["A"], run["steps"], run["tokenizer"]
    assert A[6:].tolist() == [0.0, 0.0] and (A[:6] != 0).all()
    ((taught, _),) = run["step_passes"]
    assert len(taught) == 4 and len(unique_rows(taught)) == 2  # padded to the micro-batch of 4
    block = format_plan(SIBLING_HEADLINE, ["take mug 1 from countertop 1", "move mug 1 to coffeemachine 1"])
    responses = steps.batch["responses"][[2, 3]]
    prompt = teacher_prompt_ids(chat_prompt(tokenizer, TASKS["a"]), *hindsight_turn(tokenizer, block), tokenizer)
    want = {tuple(prompt + r[steps.batch["response_mask"][2 + k].bool()].tolist()) for k, r in enumerate(responses)}
    assert unique_rows(taught) == want
    assert run["metrics"]["sharpo/taught_share"] == 2 / 8 and run["metrics"]["sharpo/moving_share"] == 6 / 8


def assert_plain_forward(passed: DataProto, scored: DataProto, model) -> None:
    """Each row's log-probs from verl's pass equal a plain forward's over its sampled tokens (1e-5)."""
    for k in range(len(passed)):
        row = passed.batch["input_ids"][k][passed.batch["attention_mask"][k].bool()].tolist()  # unpadded
        attended = passed.batch["attention_mask"][k, -passed.batch["responses"].shape[1]:].bool()  # (T,)
        plain = plain_log_probs(model, row, int(attended.sum()))  # (n,) the response's positions
        sampled = passed.batch["response_mask"][k][attended].bool()  # (n,) the model's own tokens
        assert torch.allclose(scored.batch["old_log_probs"][k][attended][sampled], plain[sampled], atol=1e-5), k


def test_teacher_log_probs_equal_a_plain_forward_of_the_teacher_rows(run):
    """verl's workers score each teacher row (hindsight prompt, then the response) as a plain
    forward of the same model does, to 1e-5, in both layouts (the multi-turn rows with the
    environment's tokens inside the response); both passes ran before the update moved the model."""
    ((taught, scored_steps),) = run["step_passes"]
    assert_plain_forward(taught, scored_steps, run["model"])
    ((taught, scored_trajectories),) = run["trajectory_passes"]
    assert_plain_forward(taught, scored_trajectories, run["model"])
    old = run["trajectories"].batch["old_log_probs"]
    assert torch.equal(run["logp_trajectories"][0], old[0])  # the winner: no hindsight, its own log-probs
    assert not torch.equal(run["logp_trajectories"][1:], old[1:])


def test_no_hindsight_leaves_the_advantage_exactly_a(run):
    """Samples without a hindsight block (the win, group b) train on Ahat == A exactly, as floats;
    the taught ones (group a's losses) on A times the multiplier's mix, not A."""
    steps, A = run["steps"], run["A"]
    mask = steps.batch["response_mask"].bool()
    ahat = steps.batch["advantages"]
    for b in (0, 1, 4, 5, 6, 7):
        assert torch.equal(ahat[b][mask[b]], A[b].expand(int(mask[b].sum()))), b
    for b in (2, 3):
        assert not torch.equal(ahat[b][mask[b]], A[b].expand(int(mask[b].sum()))), b


def test_one_update_moves_each_sample_in_the_direction_of_its_advantage(run):
    """After one `_update_actor` step (AdamW, lr 1e-3), each sample's mean response log-prob rose
    where its Ahat > 0 and fell where Ahat < 0; the A = 0 samples moved less than any other."""
    steps = run["steps"]
    mask = steps.batch["response_mask"].bool()
    change = ((run["logp_after"] - steps.batch["old_log_probs"]) * mask).sum(-1) / mask.sum(-1)  # (B,)
    ahat = (steps.batch["advantages"] * mask).sum(-1) / mask.sum(-1)  # (B,)
    moving = ahat != 0
    assert (torch.sign(change[moving]) == torch.sign(ahat[moving])).all(), (change, ahat)
    assert change[~moving].abs().max() < change[moving].abs().min(), (change, ahat)
