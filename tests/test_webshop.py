"""WebShop offline: reward terms by hand, search, pages and invalid actions, the expert, data errors."""
import json
import shutil

import pytest

import train
from envs.webshop import SHIPPED_DATA, Page, SearchEngine, WebShopEnv, load_products, parse_action
from envs.webshop_reward import attribute_matches, option_matches, purchase_score, type_reward
from eval import ExpertPolicy, summarize
from infra.cli import DataError
from rollout import play_episodes


@pytest.fixture(scope="module")
def env():
    return WebShopEnv()


def _product(**kw):
    p = {"asin": "B000000001", "Title": "Blue Running Shoes for Men", "name": "Blue Running Shoes for Men",
         "Description": "A light shoe with a breathable upper.", "BulletPoints": ["Non slip sole"],
         "Attributes": ["lightweight", "rubber sole"], "query": "running shoes",
         "product_category": "Clothing › Men › Shoes › Running", "options": {"size": ["9", "10"]}}
    p.update(kw)
    return p


def _goal(**kw):
    g = {"asin": "B000000001", "name": "Blue Running Shoes for Men", "query": "running shoes",
         "product_category": "Clothing › Men › Shoes › Running", "attributes": ["lightweight"],
         "goal_options": ["10"], "price_upper": 50.0}
    g.update(kw)
    return g


def test_attribute_match_by_fuzzy_ratio_and_by_substring():
    """'light weight' matches the attribute 'lightweight' by token_set_ratio > 85; 'breathable'
    is in no attribute but is a substring of the description; 'waterproof' is nowhere."""
    p = _product()
    assert attribute_matches(p, _goal(attributes=["lightweight"])) == 1
    assert attribute_matches(p, _goal(attributes=["breathable"])) == 1
    assert attribute_matches(p, _goal(attributes=["non slip"])) == 1  # in the bullet points
    assert attribute_matches(p, _goal(attributes=["waterproof"])) == 0


def test_option_match():
    """A chosen option value matches a goal option when token_set_ratio > 85 (case-insensitive)."""
    assert option_matches(["10"], _goal(goal_options=["10"])) == 1
    assert option_matches(["Navy Blue"], _goal(goal_options=["navy blue"])) == 1
    assert option_matches(["9"], _goal(goal_options=["10"])) == 0


def test_type_reward_cases():
    """Same product name: 1; a name sharing no content word: 0; sharing 1 of 12 words (< 0.1):
    0.1; sharing 1 of 6 (0.17: not > 0.2) with no query or category match: 0.5."""
    assert type_reward(_product(), _goal()) == 1.0
    other = _product(name="Ceramic Coffee Mug", query="mug", product_category="Home › Kitchen")
    assert type_reward(other, _goal()) == 0.0
    long_name = "Alpha Bravo Charlie Delta Echo Foxtrot Golf Hotel India Juliet Kilo Shoes"
    few = _product(name="Shoes Rack", query="rack", product_category="Home › Storage")
    assert type_reward(few, _goal(name=long_name)) == 0.1
    half = _product(name="Running Socks", query="socks", product_category="Sports › Outdoor")
    assert type_reward(half, _goal(name="Running Trail Waterproof Men Hiking Boots")) == 0.5  # 1/6 words


def test_purchase_score_by_hand():
    """score = r_type * (attrs + options + price) / (n_attrs + n_options + 1):
    all matched: 1.0; wrong option: 2/3; over the price limit: 2/3; both: 1/3."""
    p, g = _product(), _goal()
    assert purchase_score(p, g, 40.0, ["10"]) == 1.0
    assert purchase_score(p, g, 40.0, ["9"]) == pytest.approx(2 / 3)
    assert purchase_score(p, g, 60.0, ["10"]) == pytest.approx(2 / 3)
    assert purchase_score(p, g, 60.0, ["9"]) == pytest.approx(1 / 3)


def test_search_ranks_the_obvious_product_first(env):
    """A query with a product's distinctive words returns that product first."""
    engine = SearchEngine(env.products)
    top = engine.search("merino wool hiking socks")
    assert env.by_asin[top[0]]["Title"].startswith("Merino Wool Hiking Socks")
    assert engine.search("the of and") == []  # only stopwords: nothing to match
    assert len(engine.search("a")) == 0 and len(engine.search("organic")) >= 2


def test_pages_transitions_and_invalid_actions(env):
    """search -> results -> item (option, description, < prev) -> back to search; an invalid
    action leaves the page unchanged, costs 0.1 and says why; search works from any page, as
    upstream (the search page is the one that lists it); buy now ends the episode."""
    task = env.tasks("test")[0]
    goal = env.goal(task)
    s = env.reset([task])[0]
    assert s.admissible == ["search[<your query>]"] and s.observation.startswith("WebShop [SEP] Instruction:")
    say = lambda a: env.step([f"<think>.</think><action>{a}</action>"])[0]  # noqa: E731
    s = say("click[buy now]")
    assert s.invalid and s.reward == pytest.approx(-0.1) and "not a button" in s.observation
    s = say(f"search[{goal['words']}]")
    assert "Page 1 (Total results:" in s.observation and "click[back to search]" in s.admissible
    assert not any(a.startswith("search") for a in s.admissible)
    s = say(f"click[{goal['asin'].lower()}]")
    assert "Buy Now" in s.observation and "click[description]" in s.admissible
    s = say("click[description]")
    assert s.admissible == ["click[back to search]", "click[< prev]"]
    s = say("click[< prev]")
    assert "Buy Now" in s.observation
    s = say("search[merino wool socks]")  # from an item page
    assert not s.invalid and "Merino Wool Hiking Socks" in s.observation
    s = say("click[back to search]")
    assert s.observation.endswith("Search") and not s.done


INSTRUCTION = ("Instruction: [SEP] i would like hyaluronic acid and sensitive skin face moisturizer in size 1.7 oz, "
               "and price lower than 50.00 dollars [SEP] Back to Search")


def test_pages_render_as_upstream(env):
    """Literal pages of the shipped catalog, as upstream's text mode renders them (its
    templates, visible texts stripped and joined by [SEP]): prices are the catalog's tags
    ($9.5, $24.99 to $32.99); Next > is on every results page and past the end leads to an
    empty page; Rating N.A. and an empty Reviews page (upstream's loader reads neither); a
    blank search runs and finds nothing; search[] (nothing inside) is invalid."""
    task = env.tasks("test")[0]
    assert env.goal(task)["asin"] == "B0SHRP0004"  # the instruction in INSTRUCTION
    env.reset([task])
    say = lambda a: env.step([f"<think>.</think><action>{a}</action>"])[0]  # noqa: E731
    assert say("search[hair extensions]").observation == INSTRUCTION + (
        " [SEP] Page 1 (Total results: 3) [SEP] Next > [SEP] B0SHRP0002 [SEP] Clip In Hair Extensions Long Straight"
        " Natural Looking Synthetic Hairpiece [SEP] $24.99 to $32.99 [SEP] B0SHRP0001 [SEP] Volume Boost Shampoo"
        " for Fine Hair, Paraben Free [SEP] $9.5 [SEP] B0SHRP0000 [SEP] Herbal Clarity Sulfate Free Shampoo for Dry"
        " Hair with Argan Oil [SEP] $12.99")
    s = say("click[b0shrp0002]")
    assert s.observation == INSTRUCTION + (
        " [SEP] < Prev [SEP] color [SEP] dark brown [SEP] blonde [SEP] black [SEP] length [SEP] 18 inch [SEP] 22 inch"
        " [SEP] Clip In Hair Extensions Long Straight Natural Looking Synthetic Hairpiece [SEP] Price: $24.99 to"
        " $32.99 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    assert s.admissible == ["click[back to search]", "click[< prev]", "click[dark brown]", "click[blonde]",
                            "click[black]", "click[18 inch]", "click[22 inch]", "click[description]",
                            "click[features]", "click[reviews]", "click[buy now]"]
    assert say("click[reviews]").observation == INSTRUCTION + " [SEP] < Prev"
    assert say("click[< prev]").observation.endswith("[SEP] Buy Now")
    assert say("click[features]").observation == INSTRUCTION + (
        " [SEP] < Prev [SEP] Natural looking long straight hair [SEP] Clip in within minutes")
    s = say("search[ ]")
    assert not s.invalid and s.observation == INSTRUCTION + " [SEP] Page 1 (Total results: 0) [SEP] Next >"
    assert s.admissible == ["click[back to search]", "click[next >]"]
    s = say("click[next >]")  # past the end: an empty page 2
    assert s.observation == INSTRUCTION + " [SEP] Page 2 (Total results: 0) [SEP] < Prev [SEP] Next >"
    assert say("search[]").invalid


def _catalog(tmp_path, edit_products=None, edit_goals=None) -> WebShopEnv:
    """The shipped catalog, copied to tmp_path with its products and/or human goals edited."""
    root = tmp_path / "ws"
    shutil.copytree(SHIPPED_DATA, root)
    for name, edit in [("items_shuffle.json", edit_products), ("items_human_ins.json", edit_goals)]:
        if edit is not None:
            data = json.loads((root / name).read_text())
            edit(data)
            (root / name).write_text(json.dumps(data))
    return WebShopEnv(data_dir=root)


def test_option_groups_as_upstream(tmp_path):
    """A value shown in two option groups is chosen in the last of them (upstream's page maps a
    value to its last radio button); a group with no values is shown by its name alone."""
    def edit(products):
        products[2]["customization_options"] = {
            "color": [{"value": "Black"}, {"value": "Blonde"}], "size": [], "style": [{"value": "black"}]}
    env = _catalog(tmp_path, edit_products=edit)
    page = Page("item", asin="B0SHRP0002")
    goal = env.goal(env.tasks("train")[0])
    text, clicks, _ = env.render(page, goal)
    assert text.endswith("[SEP] < Prev [SEP] color [SEP] black [SEP] blonde [SEP] size [SEP] style [SEP] black [SEP] "
                         "Clip In Hair Extensions Long Straight Natural Looking Synthetic Hairpiece [SEP] Price: $24.99 "
                         "to $32.99 [SEP] Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    assert clicks[:4] == ["back to search", "< prev", "black", "blonde"]
    assert env._transition(page, "click[black]", goal).chosen == {"style": "black"}


def test_instruction_text_stripped_as_upstream(tmp_path):
    """upstream strips only the dots at the ends of a human instruction (then adds the price
    text); the page shows the text stripped of spaces, as every visible text is."""
    def edit(goals):
        goals["B0SHRP0004"][0]["instruction"] = "..i need a face moisturizer.. "
    env = _catalog(tmp_path, edit_goals=edit)
    goal = next(g for g in env.goals if g["asin"] == "B0SHRP0004")
    assert goal["instruction_text"] == "i need a face moisturizer.. " + f", and price lower than {goal['price_upper']:.2f} dollars"
    text, _, _ = env.render(Page(), goal)
    assert text == f"WebShop [SEP] Instruction: [SEP] {goal['instruction_text']} [SEP] Search"


def test_sampled_price_keeps_full_precision(env):
    """The price a purchase is checked against is upstream's uniform draw, unrounded; pages
    show the catalog's tag instead."""
    ranged = [p for p in env.products if len(p["pricing"]) == 2]
    assert ranged and all(round(env.prices[p["asin"]], 2) != env.prices[p["asin"]] for p in ranged)
    assert all(p["pricing"][0] <= env.prices[p["asin"]] <= p["pricing"][1] for p in ranged)


def test_expert_scores_one_on_every_shipped_goal(env):
    """eval.py --policy expert: every shipped goal, train and test, is bought with score 1.0."""
    tasks = env.tasks("train") + env.tasks("test")
    trajs = play_episodes(env, tasks, ExpertPolicy(), 2)
    assert len(tasks) >= 60 and len(env.products) >= 30
    assert all(t.info["score"] == 1.0 and t.won and t.reward == 10.0 for t in trajs)
    assert summarize(trajs)["mean_score"] == 1.0


def test_expert_plan_matches_the_expert_policy(env):
    """expert_plan (for --hindsight expert) is the action sequence the expert policy plays."""
    task = env.tasks("train")[3]
    traj = play_episodes(env, [task], ExpertPolicy(), 2)[0]
    assert traj.actions == env.expert_plan(task)


@pytest.mark.parametrize("text,ok", [
    ("<think>.</think><action>search[Blue Shoes]</action>", "search[blue shoes]"),
    ("<think>.</think><action>search[ ]</action>", "search[ ]"),  # blank: runs, finds nothing
    ("<think>.</think><action>click[Buy Now]</action>", None),  # not on the search page
    ("<think>.</think><action>buy now</action>", None),
    ("<think>.</think><action>search[]</action>", None),
    ("search[shoes]", None),  # no tags
])
def test_parse_action_on_the_search_page(text, ok):
    """Upstream's rules: name[arg] with something inside, arg lowercased; clicks on the page's buttons."""
    assert parse_action(text, [])[0] == ok


def test_goals_split_is_seeded_and_disjoint(env):
    """train and test goals partition all goals; the same catalog always gives the same split."""
    train_ids, test_ids = set(env.tasks("train")), set(env.tasks("test"))
    assert not train_ids & test_ids and len(train_ids | test_ids) == len(env.goals)
    assert WebShopEnv().tasks("test") == env.tasks("test")


def test_malformed_file_names_the_file_and_field(tmp_path, env):
    """A product without 'name' is an error naming the file and the field; a missing folder says what to do."""
    items = [{"asin": "B0BAD00001", "full_description": "", "small_description": [], "pricing": "$1"}]
    (tmp_path / "items_shuffle_1000.json").write_text(json.dumps(items))
    (tmp_path / "items_ins_v2_1000.json").write_text("{}")
    with pytest.raises(ValueError, match=r"items_shuffle_1000.json: product B0BAD00001 has no field 'name'"):
        load_products(tmp_path / "items_shuffle_1000.json", tmp_path / "items_ins_v2_1000.json")
    with pytest.raises(DataError, match="--data-dir"):
        WebShopEnv(data_dir=tmp_path / "nowhere")


def test_short_training_run_on_webshop(tmp_path):
    """train.py --env webshop runs an iteration with the tiny model and writes a checkpoint."""
    args = train.parse_args(["--env=webshop", "--model=tiny", "--preset=none", "--iterations=1", "--groups=2",
                             "--group-size=2", "--max-steps=2", "--max-new-tokens=6", "--lora-r=4",
                             "--hindsight=expert", "--eval-every=1", "--eval-games=2", f"--output-dir={tmp_path}/run"])
    history = train.train(args)
    assert history[0]["iteration"] == 1 and "eval/mean_score" in history[0]
    assert (tmp_path / "run" / "latest" / "adapter_config.json").exists()
