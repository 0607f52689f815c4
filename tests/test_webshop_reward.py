"""WebShop's purchase score against upstream WebShop's: its own reward tests, ported; r_type
against spaCy's nouns over the whole shipped catalog; colour normalisation and rounding."""
import itertools
import json
from math import isclose
from pathlib import Path

import pytest
from rapidfuzz import fuzz as raw_fuzz
from rapidfuzz import utils as raw_utils

from envs.webshop import WebShopEnv
from envs.webshop_reward import (
    attribute_matches,
    goal_option_list,
    normalize_color,
    option_match,
    option_matches,
    purchase_score,
    r_type_from,
    type_match,
    type_reward,
)

# spaCy's nouns for the names below, recorded once by tests/make_spacy_nouns.py
SPACY = json.loads((Path(__file__).parent / "data" / "webshop_spacy_nouns.json").read_text())
NAMES = list(SPACY["upstream_tests"])


def spacy_title_score(nouns: dict, desired: str, purchased: str) -> float:
    """upstream get_type_reward's title_score from spaCy's recorded nouns."""
    d, p = set(nouns[desired]), set(nouns[purchased])
    return 0.2 if not d else len(d & p) / len(d)


# ----------------------------------------------------------------------------- upstream's tests, ported
def test_type_reward_as_upstream_test_get_type_reward():
    """Follows upstream test_goal.py::test_get_type_reward. Query and category matching are exact
    ports. The title scores depend on the spaCy model: upstream's tolerances (0.333, 0.3, 0.15
    +-0.01) came from an older model, and upstream's own code with spaCy 3.8 gives 0.4, 0.3125 and
    0.1667 (recorded in tests/data). Here the approximation's values are asserted (by hand below),
    and that they give upstream's r_type for each pair."""
    goal = {"query": "Query 1", "product_category": "a › b › c", "name": "Name 1"}
    bought = {"query": "Query 1", "product_category": "a › b › c", "name": "Name 1"}
    m = type_match(bought, goal)
    assert m["r_type"] == 1.0 and m["query_match"] and m["category_match"] and m["title_score"] == 1

    bought["query"] = "Query 2"
    assert not type_match(bought, goal)["query_match"]

    for cats, match in [("b › c › a", True), ("d › e › f", False), ("a › d › b", True), ("a › a › b", True),
                        ("a › a › d", False)]:  # out of order / none / partial / duplicated levels
        bought["product_category"] = cats
        assert type_match(bought, goal)["category_match"] is match, cats

    # (goal name, bought name, upstream's expected title score, the approximation's, by hand)
    cases = [
        # 4 shared nouns (mens basketball sneakers shoes) of 10 goal words: d.o.n issue gca casual off white
        (NAMES[1], NAMES[2], 0.333, 4 / 10),
        # 5 shared (power cord home theater system) of 17 distinct words ("bar" is there twice)
        (NAMES[3], NAMES[4], 0.3, 5 / 17),
        # 2 shared (power cord) of 13 distinct words
        (NAMES[5], NAMES[4], 0.15, 2 / 13),
        (NAMES[6], NAMES[7], 0.0, 0.0),  # upstream: < 0.05
    ]
    for desired, purchased, upstream, ours in cases:
        goal["name"], bought["name"] = desired, purchased
        bought["query"], bought["product_category"] = "Query 2", "d › e › f"  # r_type from the title alone
        m = type_match(bought, goal)
        assert m["title_score"] == pytest.approx(ours)
        spacy = spacy_title_score(SPACY["upstream_tests"], desired, purchased)
        assert m["r_type"] == r_type_from(False, False, spacy) == r_type_from(False, False, upstream)


def test_attribute_reward_as_upstream_test_get_attribute_reward():
    """Follows upstream test_goal.py::test_get_attribute_reward (r_attr = matches / n_attrs).
    The first product has no Title, BulletPoints or Description: every attribute matches by
    fuzzy ratio, so they are never read (upstream reads them only for an unmatched attribute)."""
    goal = {"attributes": ["tea tree", "essential oils", "natural ingredients"]}
    assert attribute_matches({"Attributes": ["tea tree", "essential oil", "natural ingredients"]}, goal) == 3
    partial = {"Attributes": ["essential oil", "natural ingredients"], "Title": "", "BulletPoints": [], "Description": ""}
    assert attribute_matches(partial, goal) == 2  # r_attr 2/3
    in_text = {"Attributes": [], "Title": "", "BulletPoints": ["This shampoo has essential oils and smells like lemons"],
               "Description": "Best shampoo on the market, made with natural ingredients"}
    assert attribute_matches(in_text, goal) == 2
    none = {"Attributes": ["tea bag", "earl gray", "lipton"], "Title": "English tea for breakfast",
            "BulletPoints": ["Soothing aroma", "Calming, great feeling"],
            "Description": "Best tea made by Lipton, great to pair with breakfast"}
    assert attribute_matches(none, goal) == 0


def test_option_reward_as_upstream_test_get_option_reward():
    """Follows upstream test_goal.py::test_get_option_reward (r_option = matches / n_goal_options;
    upstream's r_option is None for a goal without options, where the count here is 0)."""
    def count(purchased, goal_options):
        return option_matches(purchased, {"goal_options": goal_options})

    assert count(["pack of 12", "grey", "XL"], ["grey", "XL", "pack of 12"]) == 3  # exact
    assert count(["pack of 12", "blue", "XL"], ["grey", "XL", "pack of 12"]) == 2  # partial
    assert count(["pack of 12", "powder snow", "XL"], ["cool powder snow", "XL", "pack of 12"]) == 3  # fuzzy
    assert count(["goal 1", "goal 2"], []) == 0  # no goal options
    assert count([], ["goal 1", "goal 2"]) == 0  # nothing chosen


def test_purchase_score_as_upstream_test_get_reward():
    """Follows upstream test_goal.py::test_get_reward, whose goal options are a synthetic goal's
    dict {name: value}: upstream matches its (name, value) pairs, and "grey" is a colour, so
    ("color", "grey") normalises to "grey". The bullet points become a string halfway, which
    upstream joins letter by letter, as here. The last case's r_type is 0.5 through a title
    score between 0.1 and 0.2 (spaCy 3.8: 0.1667; the approximation: 2/13)."""
    goal = {"query": "Query 1", "product_category": "a › b › c",
            "name": "Mens D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off White",
            "attributes": ["tea tree", "essential oils", "natural ingredients"],
            "goal_options": {"color": "grey", "size": "XL"}, "price_upper": 40.00}
    bought = {"query": "Query 1", "product_category": "a › b › c", "name": goal["name"],
              "Attributes": ["tea tree", "essential oil", "natural ingredients"], "Title": "", "BulletPoints": [],
              "Description": ""}
    chosen = ["grey", "XL"]
    assert purchase_score(bought, goal, 35, chosen) == 1

    bought["Attributes"], bought["Title"] = [], ""
    bought["BulletPoints"] = "This shampoo has essential oils and smells like lemons"
    bought["Description"] = "Best shampoo on the market, made with natural ingredients"
    assert isclose(purchase_score(bought, goal, 35, chosen), 2 / 3, abs_tol=1e-2)

    goal["goal_options"] = {"color": "grey", "size": "XL", "amount": "pack of 12"}
    assert isclose(purchase_score(bought, goal, 35, chosen), 0.5714, abs_tol=1e-2)

    goal["name"] = NAMES[5]
    bought.update(name=NAMES[4], query="Query 2", product_category="a › d › e")
    assert isclose(purchase_score(bought, goal, 35, chosen), 0.2857, abs_tol=1e-2)


# ----------------------------------------------------------------------------- r_type against spaCy
def _differences(nouns: dict, pairs) -> list[tuple]:
    """(goal name, bought name, r_type here, r_type from spaCy's nouns) for every pair that differs."""
    out = []
    for goal, product in pairs:
        m = type_match(product, goal)
        spacy = r_type_from(m["query_match"], m["category_match"], spacy_title_score(nouns, goal["name"], product["name"]))
        if m["r_type"] != spacy:
            out.append((goal["name"], product["name"], m["r_type"], spacy))
    return out


def test_r_type_never_above_spacy_on_the_whole_shipped_catalog():
    """Every goal x product pair of the shipped catalog: the approximation's r_type is never
    above the one upstream's spaCy nouns give. The pairs where it is below are listed (run
    with -s); each is a shared adjective spaCy tagged PROPN in a title-case name (free,
    waterproof, long, wireless, ...), which upstream credits and the approximation does not."""
    env = WebShopEnv()
    missing = {p["name"] for p in env.products} - set(SPACY["catalog"])
    assert not missing, f"names without spaCy nouns: run tests/make_spacy_nouns.py ({sorted(missing)[:3]})"
    pairs = [(g, p) for g in env.goals for p in env.products]
    diffs = _differences(SPACY["catalog"], pairs)
    for goal, product, ours, spacy in diffs:
        print(f"r_type {ours} (spaCy {spacy}): goal {goal!r}, bought {product!r}")
    above = [d for d in diffs if d[2] > d[3]]
    assert len(pairs) == 68 * 34 and not above, above
    # the pairs where content words won spuriously before: "free", "organic", "charging", "oz"
    bottle = next(p for p in env.products if p["name"].startswith("Insulated Stainless Steel Water Bottle"))
    mug = next(g for g in env.goals if g["name"].startswith("Ceramic Coffee Mug"))
    assert type_reward(bottle, mug) == 0.0  # shared "oz" only


def test_r_type_never_above_spacy_on_held_out_names():
    """40 product names written after the word lists were fixed (tests/make_spacy_nouns.py),
    every ordered pair with no query or category match: never above spaCy's r_type. (Measured
    when written: 36 of 1,560 pairs below, none above.)"""
    nouns = SPACY["held_out"]
    as_product = lambda name: {"name": name, "query": name, "product_category": name}  # noqa: E731
    pairs = [(as_product(a), as_product(b)) for a, b in itertools.permutations(nouns, 2)]
    diffs = _differences(nouns, pairs)
    assert len(pairs) == 40 * 39 and not [d for d in diffs if d[2] > d[3]]


def test_a_shared_adjective_alone_never_wins():
    """The spurious win that content words gave: a blue mug bought for blue running shoes
    scored 1.0; upstream gives r_type 0 (spaCy: blue is an adjective), and so does this."""
    goal = {"name": "blue running shoes for men", "query": "running shoes", "product_category": "Clothing › Shoes"}
    mug = {"name": "blue ceramic coffee mug", "query": "mug", "product_category": "Home › Kitchen"}
    assert type_reward(mug, goal) == 0.0
    assert spacy_title_score(SPACY["upstream_tests"], goal["name"], mug["name"]) == 0.0


# ----------------------------------------------------------------------------- options and rounding
def test_colours_are_normalised_before_matching():
    """upstream normalize_color: an option becomes the first colour name (in upstream's list order)
    it contains, so light blue and dark blue both become blue and match; navy blue becomes blue
    and no longer matches navy; "standard" contains "tan"."""
    assert normalize_color("light blue") == normalize_color("dark blue") == "blue"
    assert option_match("light blue", "dark blue")
    assert normalize_color("navy blue") == "blue" and not option_match("navy", "navy blue")
    assert normalize_color("standard") == "tan" and option_match("tan", "standard")
    assert normalize_color("16 fl oz") == "16 fl oz"
    # a synthetic goal's (name, value) pair: a colour only if one part is one
    assert goal_option_list({"goal_options": {"color": "grey", "size": "xl"}}) == [("color", "grey"), ("size", "xl")]
    assert normalize_color(("color", "grey")) == "grey" and normalize_color(("color", "light grey")) == ("color", "light grey")
    assert option_match("xl", ("size", "xl"))


def test_fuzzy_score_is_rounded_before_the_threshold():
    """upstream's thefuzz rounds token_set_ratio to an integer before the > 85 test: 85.1 is 85,
    no match, where the unrounded score would match."""
    a, b = "chocolate sleeve silver", "chocolate toddler sleeve"
    assert 85 < raw_fuzz.token_set_ratio(a, b, processor=raw_utils.default_process) < 85.5
    product = {"Attributes": [a], "Title": "", "BulletPoints": [], "Description": ""}
    assert attribute_matches(product, {"attributes": [b]}) == 0
