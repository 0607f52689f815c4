"""The rollouts' [speed] path (speed.shared_prefix_generate): each prompt prefix shared by
several rows of a generate call is prefilled once, and no padding is prefilled; the sampling,
the log-probs of the sampled tokens and the episodes are the plain path's (rollout.generate), to
float rounding. While it decodes, the KV cache is written in place: that changes no number at all,
in bf16 too."""
import pytest
import torch
from transformers.cache_utils import DynamicLayer

import rollout

from infra.models import load_policy
from rollout import ModelPolicy, play_episodes
from segments import generation_prompt_ids
from speed import FastPath, InPlaceLayer, common_length, prefilled_rows, prefix_clusters, shared_prefix_generate

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


def spy_logits(model, log: list) -> torch.utils.hooks.RemovableHandle:
    """Record in `log` the log-softmax of every logit the output head computes (each decode step's
    sampling distribution, (B, V)); the handle removes the spy."""
    def record(module, args, out):
        log.append(out.float().log_softmax(-1))
    return model.get_output_embeddings().register_forward_hook(record)


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
        spy = spy_logits(model, logs[name])
        torch.manual_seed(3)
        sampled[name] = ModelPolicy(model, tok, max_new_tokens=6, temperature=1.0, batch=batch,
                                    generate=sample).generate(prompts)
        spy.remove()
    assert [s[1] for s in sampled["plain"]] == [s[1] for s in sampled["fast"]]
    assert len(logs["plain"]) == len(logs["fast"]) >= 6  # every step's distribution, compared
    for plain, fast in zip(logs["plain"], logs["fast"]):
        assert (plain - fast).abs().max() < 1e-5
    assert len({tuple(s[1]) for s in sampled["plain"][:3]}) > 1  # the group's rows sampled apart: not vacuous


def test_the_prefill_computes_each_distinct_token_once_and_no_padding():
    """speed.prefilled_rows: a cluster's prefix once, then each row's remainder but its last token, nothing
    else (a batched prefill would compute every row to the longest prefix and remainder). Each row's cached
    states, right-aligned after zeros, are what one forward over that row alone caches (float32, 1e-5)."""
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=1)
    task = "You are a household agent. Your task is to: put a clean mug in the coffeemachine. "
    tails = ["You see a countertop 1.", "You see a countertop 1.", "Past: look. You are in the middle of a room, "
             "and around you are a cabinet 1, a cabinet 2, a countertop 1 and a sinkbasin 1."]
    prompts = [generation_prompt_ids(tok, [{"role": "user", "content": task + t}]) for t in tails]
    prompts.append(generation_prompt_ids(tok, [{"role": "user", "content": "Your task is to: look at a book."}]))
    cluster_of, n = prefix_clusters(prompts)
    assert cluster_of == [0, 0, 0, 1] and len(set(map(len, prompts))) == 3  # rows of three lengths
    computed = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, args, out: computed.append(args[0].numel()))
    with torch.no_grad():
        cache = prefilled_rows(model, prompts)
    hook.remove()
    assert sum(computed) == sum(n) + sum(len(p) - 1 - n[c] for p, c in zip(prompts, cluster_of))
    W = max(map(len, prompts)) - 1
    for b, p in enumerate(prompts):
        with torch.no_grad():
            alone = model.get_decoder()(input_ids=torch.tensor([p[:-1]]), use_cache=True)
        for mine, its in zip(cache.layers, alone[rollout.cache_keyword(model)].layers):
            assert mine.keys.shape[2] == W and not mine.keys[b, :, : W - len(p) + 1].any()  # the padding: zeros
            assert torch.allclose(mine.keys[b, :, W - len(p) + 1 :], its.keys[0], atol=1e-5)
            assert torch.allclose(mine.values[b, :, W - len(p) + 1 :], its.values[0], atol=1e-5)


def test_one_token_prompts_need_no_cache_and_decode_as_the_plain_generate_does():
    """A prompt of one token has nothing to prefill: alone, generate gets no cache; beside longer prompts,
    its row of the cache is padding. Greedy, both decode what the plain generate does."""
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=1)
    config = rollout.sampling_config(tok, model, 5, temperature=0.0)
    longer = generation_prompt_ids(tok, [{"role": "user", "content": "a mug on a table"}])
    for prompts in ([[7]], [[7], longer, longer[:-3]]):
        with torch.no_grad():
            fast = shared_prefix_generate(model, prompts, config, tok.pad_token_id)
            plain = rollout.generate(model, prompts, config)
        assert fast == plain and len(fast[0]) == 5


@pytest.mark.slow
def test_a_greedy_rollout_of_the_demo_s_games_takes_the_same_actions_both_ways():
    """The embedded model with the demo's warm start, greedy, on 2 of the shipped games, 2 episodes each, 3
    turns: every episode's actions are the same with the shared-prefix prefill as without it."""
    from envs.make import make_env, training_tasks
    from flags import DATA, WARMSTART

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


def test_the_in_place_layer_holds_what_concatenation_would():
    """Token by token, the in-place layer returns what DynamicLayer's concatenation does, in the same
    buffer until its room is used up; after a crop it writes where the cropped states end; after a
    selection of rows it starts a buffer from them."""
    torch.manual_seed(0)
    grown, in_place = DynamicLayer(), InPlaceLayer()
    steps = [torch.randn(3, 2, k, 4) for k in (5, 1, 1, 7)] + [torch.randn(3, 2, 1, 4) for _ in range(InPlaceLayer.GROW)]
    buffers, held = [], 0
    for x in steps:
        expect, got = grown.update(x, -x), in_place.update(x, -x)
        assert torch.equal(expect[0], got[0]) and torch.equal(expect[1], got[1])
        held += x.shape[-2]
        buffers.append((in_place.buffers[0].data_ptr(), held <= 5 + InPlaceLayer.GROW))
    # the first 5 tokens' buffer takes every step until its room is used up; then one new buffer takes the rest
    assert len({ptr for ptr, first in buffers if first}) == 1 == len({ptr for ptr, first in buffers if not first})
    assert buffers[0][0] != buffers[-1][0]
    grown.crop(-3), in_place.crop(-3)
    x = torch.randn(3, 2, 1, 4)
    assert torch.equal(grown.update(x, x)[0], in_place.update(x, x)[0])
    rows = torch.tensor([2, 0])
    grown.batch_select_indices(rows), in_place.batch_select_indices(rows)
    selected = in_place.buffers[0].data_ptr()
    x = torch.randn(2, 2, 1, 4)
    assert torch.equal(grown.update(x, x)[1], in_place.update(x, x)[1])
    assert in_place.buffers[0].data_ptr() == selected  # the selection's own buffer: the step wrote into its room
    for rows, heads in ((slice(0, 1), slice(None)), (slice(None), slice(0, 1))):  # the first row, then head: a view
        for layer in (grown, in_place):  # that starts where the buffer does
            layer.keys, layer.values = layer.keys[rows, heads], layer.values[rows, heads]
        x = torch.randn(1, 1 if heads.stop else 2, 1, 4)
        expect, got = grown.update(x, x), in_place.update(x, x)
        assert torch.equal(expect[0], got[0]) and torch.equal(expect[1], got[1])
    held = InPlaceLayer.holding(grown)
    assert torch.equal(held.keys, grown.keys) and torch.equal(held.update(x, x)[1], grown.update(x, x)[1])
    x16 = x.bfloat16()  # a state of another dtype: what torch.cat would give (float32)
    assert grown.update(x16, x16)[0].dtype == held.update(x16, x16)[0].dtype == torch.float32
    held.reset()
    assert held.get_seq_length() == 0 and held.buffers is None


def test_in_place_decoding_samples_the_same_numbers_in_bf16():
    """bf16 weights under autocast (the CPU demo's precision), 80 new tokens (past the in-place buffer's
    room): with the cache written in place, every step's logits are exactly those of the shared-prefix
    path without it, and so are the samples."""
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=1, dtype="bf16")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    task = "You are a household agent. Your task is to: put a clean mug in the coffeemachine. "
    prompts = [generation_prompt_ids(tok, [{"role": "user", "content": task + t}])
               for t in ("You see a countertop 1.", "You see a countertop 1.", "Past: look. You are in a room.")]
    config = rollout.sampling_config(tok, model, 80)
    config.min_new_tokens = 80
    logs, sampled, seen, key = {}, {}, {}, rollout.cache_keyword(model)
    for in_place in (False, True):
        logs[in_place], seen[in_place] = [], []

        def layers(module, args, kwargs, seen=seen[in_place]):  # the cache each decoder pass is handed
            seen.append({type(layer).__name__ for layer in getattr(kwargs.get(key), "layers", [])})
        spies = [spy_logits(model, logs[in_place]),
                 model.get_decoder().register_forward_pre_hook(layers, with_kwargs=True)]
        torch.manual_seed(5)
        with torch.no_grad(), rollout.autocast(model):
            sampled[in_place] = shared_prefix_generate(model, prompts, config, tok.pad_token_id, in_place=in_place)
        for spy in spies:
            spy.remove()
    assert seen[False][-80:] == [{"DynamicLayer"}] * 80 and seen[True][-80:] == [{"InPlaceLayer"}] * 80
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16
    assert sampled[True] == sampled[False] and len(sampled[True][0]) == 80
    assert len(logs[True]) == len(logs[False]) == 80
    assert all(torch.equal(a, b) for a, b in zip(logs[True], logs[False]))


def test_packed_linears_compute_the_same_numbers_and_leave_nothing_behind():
    """speed.packed_linears: inside, a frozen bf16 linear (bias or not, 2-D or 3-D input, one row or a prefill's
    hundreds) gives exactly what autocast's bf16 linear gives, a frozen float32 one (where torch has oneDNN;
    not under bf16 autocast) what torch's float32 linear gives to float rounding, and a bf16 generate
    samples exactly the same tokens; outside, every module computes as before, and the packed copies are made
    once and kept until a weight changes. Trainable linears, the LoRA's, are not packed. (A float32 generate,
    packed, beside the plain one: test_the_cached_prefill_samples_what_the_plain_one_does.)"""
    from speed import PACKED, packed_linears

    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, 96, bias=bias).to(torch.bfloat16).requires_grad_(False) for bias in (False, True)]
    frozen = [torch.nn.Linear(96, 96, bias=bias).requires_grad_(False) for bias in (False, True)]  # float32
    net, packed = torch.nn.Sequential(*layers, *frozen, torch.nn.Linear(96, 8)), {}  # the last: trainable
    fp32 = PACKED[torch.float32]()  # oneDNN in this torch
    bf16 = PACKED[torch.bfloat16]()  # oneDNN's bf16 kernels on this CPU (not with AVX2 only)
    for x in (torch.randn(1, 64), torch.randn(300, 64), torch.randn(2, 5, 64)):
        for layer in layers:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                want = layer(x)
            with packed_linears(net, packed), torch.autocast("cpu", dtype=torch.bfloat16):
                assert ("forward" in vars(layer)) == bf16  # on the packed copy
                got = layer(x)
            assert torch.equal(got, want) and got.dtype == torch.bfloat16
        h = torch.randn(*x.shape[:-1], 96)
        for layer in frozen:
            want = layer(h)
            with packed_linears(net, packed):
                assert ("forward" in vars(layer)) == fp32  # on the packed copy
                got = layer(h)
            assert got.shape == want.shape and got.dtype == torch.float32
            assert (got - want).abs().max() <= 1e-5 * want.abs().max()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                want = layer(h)
                with packed_linears(net, packed):  # entered under autocast: float32 left to autocast
                    assert "forward" not in vars(layer) and torch.equal(layer(h), want)
    assert len(packed) == 2 * bf16 + 2 * fp32 and all("forward" not in vars(m) for m in net)
    if fp32:
        kept = packed[id(frozen[0])][2]
        with packed_linears(net, packed):
            assert packed[id(frozen[0])][2] is kept  # the weight unchanged: not packed again
        with torch.no_grad():
            frozen[0].weight.mul_(2)  # changed in place: packed again
        with packed_linears(net, packed):
            got = frozen[0](h)
        assert packed[id(frozen[0])][2] is not kept and len(packed) == 2 * bf16 + 2
        assert (got - frozen[0](h)).abs().max() <= 1e-5 * got.abs().max()
    model, tok = load_policy("tiny", lora_r=4, lora_alpha=8, seed=1, dtype="bf16")
    prompts = [generation_prompt_ids(tok, [{"role": "user", "content": t}]) for t in ("a mug", "a mug on a table")]
    config = rollout.sampling_config(tok, model, 24)
    config.min_new_tokens = 24
    fast, sampled = FastPath(tok.pad_token_id), []
    for generate in (fast.generate, lambda **kw: shared_prefix_generate(**kw, pad_id=tok.pad_token_id)):  # packed, not
        torch.manual_seed(3)
        with torch.no_grad(), rollout.autocast(model):
            sampled.append(generate(model=model, prompts=prompts, config=config))
    assert sampled[0] == sampled[1] and len(sampled[0][0]) == 24
    assert len(fast.packed) == 15 * bf16  # 2 layers x 7, the head; none where this CPU has no bf16 kernels
    assert not any("forward" in vars(m) for m in model.modules())


def test_the_decode_floor_bench_refuses_bad_input_before_it_times_anything(tmp_path, monkeypatch):
    """tools/decode_floor.py: a bad --rows, or an --out that cannot be written (a folder), is one line
    before the minutes of timing begin: no model is loaded."""
    from infra.cli import UserError
    from tools import decode_floor

    def no_model(*args, **kwargs):
        raise AssertionError("the bench loaded a model before it checked its flags")

    monkeypatch.setattr(decode_floor, "load_policy", no_model)
    monkeypatch.setattr(decode_floor, "bandwidth", no_model)
    with pytest.raises(UserError, match=r"--rows must be comma-separated positive integers; got '0,x'"):
        decode_floor.main(["--rows", "0,x"])
    with pytest.raises(UserError, match=r"is a folder, not a file: pass another --out"):
        decode_floor.main(["--out", str(tmp_path)])
