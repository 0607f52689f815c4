"""Answers and prompts: what the parser accepts as an action (exactly, in linear time), and what the
prompt shows of the history."""
import re
import time

import pytest

from envs import extract_action, step_prompt
from envs.alfworld import build_messages as alfworld_messages
from envs.webshop import build_messages as webshop_messages
from envs.webshop import parse_action
from segments import add_hindsight


def test_any_non_ascii_character_in_an_action_is_invalid():
    for space in ("\u00a0", "\u2003", "\u3000", "\u200b", "\u2028"):
        assert extract_action(f"<think>x</think><action>go to{space}desk 1</action>")[0] is None
    assert extract_action("<think>x</think><action>go to\n desk 1\t</action>")[0] == "go to desk 1"


def test_webshop_actions_are_the_whole_answer():
    clicks = ["< prev", "buy now"]
    assert parse_action("<think>x</think><action>click[< prev]</action>", clicks)[0] == "click[< prev]"
    for tail in ("; rm -rf /", " now", "]"):
        assert parse_action(f"<think>x</think><action>click[< prev]{tail}</action>", clicks)[0] is None


def test_tags_fold_case_over_ascii_only():
    """<THINK> and <Action> are tags; a Unicode letter that lowercases to an ASCII one (the
    Kelvin sign U+212A -> "k", the long s U+017F -> "s"...) does not make a tag."""
    assert extract_action("<THINK>x</Think><ACTION>look</action>")[0] == "look"
    for odd in ("<thin\u212a>x</think><action>look</action>", "<think>x</thin\u212a><action>look</action>",
                "<think>x</think><\u212bction>look</action>"):
        assert extract_action(odd)[0] is None


def test_webshop_action_parse_is_linear_and_matches_upstreams_regex():
    """The split of name[arg] is upstream's `(.+)\\[(.+)\\]` fullmatch on every short string over
    a small alphabet, and 64 kB of '[' parse in milliseconds (the regex took ~30 s)."""
    import random
    import re

    from envs.webshop import parse_web_action

    upstream = re.compile(r"(.+)\[(.+)\]")
    rng = random.Random(0)
    for _ in range(20_000):
        a = "".join(rng.choice("ab[] \n") for _ in range(rng.randint(0, 8)))
        m = upstream.fullmatch(a)
        assert parse_web_action(a) == ((a, None) if m is None else (m.group(1), m.group(2).lower())), a
    start = time.perf_counter()
    assert parse_web_action("[" * 65_536) == ("[" * 65_536, None)
    assert parse_web_action("click" + "[" * 65_537 + "x]") == ("click" + "[" * 65_536, "x")
    assert time.perf_counter() - start < 0.5


def test_tag_parsing_is_linear_on_tag_spam():
    """500 kB of unclosed tags parse in well under a second (regex pairing took ~minutes)."""
    spam = "<action>" * 40_000 + "<think>" * 20_000 + "</think" * 10_000
    assert len(spam) >= 500_000
    start = time.perf_counter()
    assert extract_action(spam)[0] is None
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("builder", [alfworld_messages, webshop_messages])
def test_history_shows_min_of_h_and_steps_pairs(builder):
    """For every H in 0..6 and every episode length 0..8, the prompt holds exactly min(H, steps)
    observation/action pairs, the most recent ones, numbered from the right step; the teacher's
    row (hindsight added) holds the same pairs."""
    for n in range(9):
        history = [(f"obs-{j}", f"act-{j}") for j in range(1, n + 1)]
        for h in list(range(7)) + [None]:
            messages = builder("a task", history, "now", ["look"], h)
            for text in (messages[0]["content"], add_hindsight(messages, "1. look")[0]["content"]):
                shown = re.findall(r"\[Step (\d+)\] Action: act-(\d+)", text)
                want = n if h is None else min(h, n)
                assert len(shown) == want, (n, h)
                assert [int(a) for a, _ in shown] == list(range(n - want + 1, n + 1))
                assert all(a == b for a, b in shown)
                assert f"[Step {n + 1}] Current observation: now" in text


def test_step_prompt_with_more_history_than_steps():
    """The case that was wrong: H = 3 after 2 steps shows both pairs (it showed 1)."""
    text = step_prompt("intro", [("o1", "a1"), ("o2", "a2")], "o3", "Actions", ["x"], "x", 3)[0]["content"]
    assert "[Step 1] Action: a1" in text and "[Step 2] Action: a2" in text
