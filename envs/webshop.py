"""WebShop, offline: upstream's text-mode shop (search, results, item pages), its reward, its files.

Pages and observations follow upstream WebShop's `text` mode: the visible texts of a page
joined by " [SEP] ", the instruction on every page. Actions are `search[query]` (from any page;
the search page is the one that lists it) and `click[button]` (a lowercased button, product
ASIN or option value shown on the page); an invalid action leaves the page unchanged.
`click[buy now]` ends the episode with the purchase's score (envs/webshop_reward.py, upstream's
goal.py). Episode reward (METHOD.md section 1): 10 if the score is 1.0, minus 0.1 per invalid
action; the raw score goes in info["score"]. At most `max_steps` (default 15) steps.

Deviations from upstream, and why:
  - Search: BM25 (bm25s, method "lucene", k1 0.9, b 0.4) with a Lucene-like English analyzer
    (lowercase, drop 's, \\w+(?:\\.\\w+)* tokens, Lucene's English stopwords, Porter stems) over
    upstream's indexed text (title, description, first bullet point, options), instead of
    Pyserini, which needs Java. Only documents with a positive score are returned, top 50.
    Upstream's special queries (`<r>`, `<a>`, `<c>`, `<q>` first words) are not supported.
  - r_type approximates spaCy's nouns (envs/webshop_reward.py says how; it errs low).
  - The done page shows the score, not an MTurk code and the goal's fields.
  - Option values (and the goals' options, the same way) are made clickable: folded to ASCII
    (NFKD, lower case: "Café™" -> "cafetm"; a character with no ASCII form is dropped), '[' ']' written
    '(' ')', because an action is printable ASCII and `click[...]` cannot hold a bracket. Upstream
    shows them as they are, so such a value could never be chosen. A value that is then empty,
    or names a page button ("buy now", "description", ...), is a data error.
Goals: upstream's human goals (items_human_ins.json), each with a price limit drawn above the
product's sampled price as upstream does; shuffled with random.Random(233) (upstream's seed),
the first 500 are `test` (upstream's test goals) -- the first quarter when there are fewer
than 2,000 goals (the shipped catalog) -- and the rest `train`.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import random
import re
import time
import unicodedata
from dataclasses import dataclass, field, replace
from pathlib import Path

import bm25s
import Stemmer

from envs import INVALID_PENALTY, WIN_REWARD, Env, EnvStep, check_responses, extract_action, step_prompt
from envs.webshop_reward import LUCENE_STOPWORDS, goal_option_list, option_match, purchase_score
from errors import DataError

SHIPPED_DATA = Path(__file__).resolve().parent.parent / "data" / "webshop"
SPLITS = ("train", "test")
PAGE_SIZE, SEARCH_TOP = 10, 50
PRICE_RANGE = [10.0 * i for i in range(1, 100)]
BACK, NEXT, PREV, BUY = "back to search", "next >", "< prev", "buy now"
SUB_PAGES = ("description", "features", "reviews")
BUTTONS = (BACK, NEXT, PREV, BUY, "search", *SUB_PAGES)  # what a page's own buttons are called
SEP = " [SEP] "
_WORD = re.compile(r"\w+(?:\.\w+)*")


# ----------------------------------------------------------------------------- data
def _read_json(path: Path, what: str):
    if not path.exists():
        raise DataError(f"WebShop {what} file not found: {path}")
    if not path.is_file():  # a folder, a FIFO (reading it would wait forever), a device
        raise DataError(f"{path} is not a regular file: WebShop's {what} data must be a JSON file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err})") from None
    except RecursionError:
        raise DataError(f"{path}: JSON nested too deeply to be env data") from None
    except OSError as err:  # there but unreadable: permission denied, an I/O error (as ALFWorld's)
        raise DataError(f"cannot read {path} ({err.strerror or err}): make the data readable (chmod -R a+rX "
                        "the data folder)") from None


def _find(root: Path, pattern: str, what: str) -> Path:
    found = sorted(root.glob(pattern))
    if not found:
        raise DataError(
            f"no WebShop {what} file ({pattern}) in {root}. Point --data-dir at a folder with upstream's "
            f"items_shuffle*.json, items_ins_v2*.json and items_human_ins.json, or leave it unset for the shipped catalog."
        )
    return found[0]


def _field(record: dict, key: str, path: Path, asin: str, kinds: tuple, optional: bool = False):
    """record[key], checked to be one of `kinds` (DataError naming file, product and field)."""
    if key not in record:
        if optional:
            return None
        raise DataError(f"{path}: product {asin} has no field {key!r}")
    value = record[key]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        names = " or ".join("null" if k is type(None) else k.__name__ for k in kinds)
        raise DataError(f"{path}: product {asin}, field {key!r} should be {names}, found {type(value).__name__}")
    return value


def _str_list(value, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise DataError(f"{where} should be a list of strings")
    return value


_ASIN = re.compile(r"[A-Z0-9]{10}")
MAX_PRICE = 1_000_000.0  # dollars: a price at or above it (or not finite) is a data error


def clickable(value: str) -> str:
    """An option value as an agent can click it (see the module docstring): lower-case ASCII
    (a click's argument is lowercased), no brackets, single spaces."""
    ascii_text = unicodedata.normalize("NFKD", value).encode("ascii", "ignore").decode("ascii").lower()
    return " ".join(ascii_text.replace("[", "(").replace("]", ")").split())


def load_products(items_path: Path, attrs_path: Path) -> list[dict]:
    """Upstream's raw product files -> products as upstream's loader makes them: Title,
    Description, BulletPoints, pricing (one or two floats) and its Price tag ("$9.5",
    "$24.99 to $32.99"), options {name: [values]} (a group with no values kept, shown by name),
    Attributes, Rating "N.A." and no Reviews (upstream's loader reads neither).
    Every field used is checked here (DataError naming file, product and field)."""
    raw, attrs = _read_json(items_path, "products"), _read_json(attrs_path, "attributes")
    if not isinstance(raw, list):
        raise DataError(f"{items_path}: expected a list of products")
    if not isinstance(attrs, dict):
        raise DataError(f"{attrs_path}: expected an object mapping ASIN to {{'attributes': [...]}}")
    products, seen = [], set()
    for k, p in enumerate(raw):
        if not isinstance(p, dict):
            raise DataError(f"{items_path}: entry {k} should be an object")
        asin = _field(p, "asin", items_path, f"#{k}", (str,))
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue  # upstream's loader skips these too
        if not _ASIN.fullmatch(asin):
            raise DataError(f"{items_path}: product {asin}, field 'asin' should be 10 upper-case letters or digits")
        seen.add(asin)
        bullets = _field(p, "small_description", items_path, asin, (list, str))
        bullets = _str_list(bullets if isinstance(bullets, list) else [bullets], f"{items_path}: product {asin}, field 'small_description'")
        pricing = _field(p, "pricing", items_path, asin, (str, type(None)))
        parts = [re.sub(r"[^\d.]", "", x) for x in str(pricing or "").split("$")[1:]]  # "$12.99 - $15.99"
        if not all(re.fullmatch(r"\d+(\.\d+)?", x) for x in parts):  # "$abc": not a price, not a default
            raise DataError(f"{items_path}: product {asin}, field 'pricing' {str(pricing)[:40]!r}: each '$' must be "
                            "followed by a number of dollars")
        prices = [float(x) for x in parts][:2] or [100.0]  # no price at all: upstream's $100
        if not all(math.isfinite(x) and 0 <= x < MAX_PRICE for x in prices):
            raise DataError(f"{items_path}: product {asin}, field 'pricing' {str(pricing)[:40]!r}: a price must be "
                            f"a finite number of dollars below {MAX_PRICE:,.0f}")
        price_tag = " to ".join(f"${x}" for x in prices)  # upstream's f"${float}": $9.5, $45.0
        options = {}
        for name, contents in (_field(p, "customization_options", items_path, asin, (dict, type(None)), True) or {}).items():
            if contents is None:
                continue
            if not isinstance(contents, list) or not all(isinstance(c, dict) and isinstance(c.get("value"), str) for c in contents):
                raise DataError(f"{items_path}: product {asin}, option {name!r} should be a list of {{'value': str}}")
            values = [clickable(c["value"].strip().replace("/", " | ").lower()) for c in contents]
            for value in values:
                if not value or value in BUTTONS:
                    raise DataError(f"{items_path}: product {asin}, option {name!r}: value {value!r} cannot be "
                                    f"chosen ({'empty once made clickable' if not value else 'it is a page button'})")
            options[name.lower()] = values
        attr = attrs.get(asin, {"attributes": ["DUMMY_ATTR"]})
        if not isinstance(attr, dict) or "attributes" not in attr:
            raise DataError(f"{attrs_path}: product {asin} should map to {{'attributes': [...]}}")
        name = _field(p, "name", items_path, asin, (str,))
        products.append({
            "asin": asin, "Title": name, "name": name,
            "Description": _field(p, "full_description", items_path, asin, (str, type(None))) or "", "BulletPoints": bullets,
            "pricing": prices, "Price": price_tag, "options": options, "category": _field(p, "category", items_path, asin, (str,), True) or "",
            "query": str(_field(p, "query", items_path, asin, (str,), True) or "").lower().strip(),
            "product_category": _field(p, "product_category", items_path, asin, (str,), True) or "",
            "Attributes": _str_list(attr["attributes"], f"{attrs_path}: product {asin}, field 'attributes'"),
            "Rating": "N.A.", "Reviews": [],
        })
    return products


def check_human_goals(human, path: Path) -> dict:
    """items_human_ins.json: {asin: [{instruction: str, instruction_attributes: [str], instruction_options: [str]}]}."""
    if not isinstance(human, dict):
        raise DataError(f"{path}: expected an object mapping ASIN to a list of instructions")
    for asin, entries in human.items():
        if not isinstance(entries, list):
            raise DataError(f"{path}: product {asin} should map to a list of instructions")
        for k, ins in enumerate(entries):
            where = f"{path}: product {asin}, instruction {k}"
            if not isinstance(ins, dict):
                raise DataError(f"{where} should be an object")
            if not isinstance(ins.get("instruction"), str):
                raise DataError(f"{where}, field 'instruction' should be a string")
            for key in ("instruction_attributes", "instruction_options"):
                if ins.get(key) is not None:
                    _str_list(ins[key], f"{where}, field {key!r}")
    return human


def sample_prices(products: list[dict], seed: int) -> dict[str, float]:
    """One price per product, the one a purchase is scored at: uniform in its price range
    (seeded, full precision, as upstream), or its only price. Pages show the Price tag instead."""
    rng = random.Random(seed)
    return {p["asin"]: rng.uniform(*p["pricing"]) if len(p["pricing"]) == 2 else p["pricing"][0] for p in products}


def make_goals(products: list[dict], human: dict, prices: dict[str, float], seed: int) -> list[dict]:
    """Upstream's human goals: each instruction of each product, with a price limit drawn from
    the next four 10-dollar steps above its price (two drawn, the larger kept), as upstream."""
    rng = random.Random(seed)
    goals = []
    for p in products:
        for ins in human.get(p["asin"], []):
            attributes = ins.get("instruction_attributes") or []
            if not attributes:
                continue
            steps = [x for x in PRICE_RANGE if x > prices[p["asin"]]][:4]
            if len(steps) >= 2:
                price_upper = sorted(rng.sample(steps, 2))[1]
                price_text = f", and price lower than {price_upper:.2f} dollars"
            else:
                price_upper, price_text = 1_000_000.0, ""
            goals.append({
                "asin": p["asin"], "category": p["category"], "query": p["query"], "name": p["name"],
                "product_category": p["product_category"], "attributes": attributes,
                "goal_options": [clickable(o) for o in ins.get("instruction_options") or []], "price_upper": price_upper,
                "words": ins["instruction"].strip().strip("."),
                "instruction_text": ins["instruction"].strip(".") + price_text,  # upstream strips only the dots
            })
    return goals


def split_goals(goals: list[dict]) -> dict[str, list[int]]:
    """Shuffle goal indices with random.Random(233); test = first 500 (or first quarter below 2,000)."""
    order = list(range(len(goals)))
    random.Random(233).shuffle(order)
    n_test = 500 if len(goals) >= 2000 else max(1, len(goals) // 4)
    return {"test": order[:n_test], "train": order[n_test:]}


# ----------------------------------------------------------------------------- search
@functools.cache
def _porter():
    return Stemmer.Stemmer("porter")  # built once, not on every document and query


def analyze(text: str) -> list[str]:
    """Lucene-like English analysis: lowercase, drop possessive 's, word tokens, stopwords, Porter stems."""
    words = [w for w in _WORD.findall(text.lower().replace("'s", "")) if w not in LUCENE_STOPWORDS]
    return _porter().stemWords(words)


class SearchEngine:
    """BM25 over upstream's indexed text of each product (title, description, first bullet, options)."""

    def __init__(self, products: list[dict]):
        self.asins = [p["asin"] for p in products]
        docs = []
        for p in products:
            options = ", and ".join(f"{name}: {', '.join(values)}" for name, values in p["options"].items())
            docs.append(analyze(" ".join([p["Title"], p["Description"], p["BulletPoints"][0] if p["BulletPoints"] else "", options])))
        self.bm25 = bm25s.BM25(method="lucene", k1=0.9, b=0.4)
        self.bm25.index(docs, show_progress=False)

    def search(self, query: str, top: int = SEARCH_TOP) -> list[str]:
        """ASINs by decreasing score (ties: catalog order), positive scores only, at most `top`."""
        tokens = analyze(query)
        if not tokens:
            return []
        scores = self.bm25.get_scores(tokens)
        ranked = sorted((i for i in range(len(self.asins)) if scores[i] > 0), key=lambda i: (-scores[i], i))
        return [self.asins[i] for i in ranked[:top]]


# ----------------------------------------------------------------------------- pages
@dataclass
class Page:
    """Where the shopper is: kind is search | results | item | description | features | reviews | done."""

    kind: str = "search"
    query: str = ""
    results: list[str] = field(default_factory=list)
    page_no: int = 1
    asin: str | None = None
    chosen: dict[str, str] = field(default_factory=dict)  # option name -> chosen value
    score: float = 0.0


def parse_web_action(action: str) -> tuple[str, str | None]:
    """Upstream's parse, 'name[arg]' -> (name, lowercased arg), over the whole action: text
    after the closing ']' makes it (text, None), an invalid action (upstream ignores such text).

    The same split as upstream's regex `(.+)\\[(.+)\\]` (greedy, matched over the whole action):
    the name ends at the last '[' that leaves a non-empty argument before the final ']'. Found
    with one rfind, in linear time (the regex backtracks quadratically on a run of '[')."""
    if "\n" in action or len(action) < 4 or not action.endswith("]"):  # `.` matches no newline
        return action, None
    cut = action.rfind("[", 1, len(action) - 2)  # a name of >= 1 char, an argument of >= 1 char
    return (action, None) if cut < 0 else (action[:cut], action[cut + 1 : -1].lower())


def parse_action(text: str, clickables: list[str]) -> tuple[str | None, str]:
    """Model text -> (a valid action, "") or (None, why it is invalid). Never raises."""
    action, why = extract_action(text)
    if action is None:
        return None, why
    name, arg = parse_web_action(action)
    if name == "search" and arg:  # from any page, as upstream; a blank query runs and finds nothing
        return f"search[{arg}]", ""
    if name == "click" and arg is not None and arg in clickables and arg != "search":
        return f"click[{arg}]", ""
    if name == "click":
        return None, f"'{arg}' is not a button on this page"
    return None, f"'{action}' is neither search[...] nor click[...]"


# ----------------------------------------------------------------------------- the env
class WebShopEnv(Env):
    """A batch of independent WebShop episodes (envs.Env is the interface)."""

    name = "webshop"
    splits = SPLITS
    default_eval_split = "test"
    default_max_steps = 15
    prompt_tokens = 900  # the longest prompt at --history 2, for the memory plan (docs/scaling.md)
    data_variable = "WEBSHOP_DATA"  # the data folder when --data-dir is not given
    real_data = ("fetch upstream WebShop's items_shuffle.json, items_ins_v2.json and items_human_ins.json (its "
                 "setup.sh), then set WEBSHOP_DATA (or --data-dir) to their folder")
    held_out_split = "test"  # the goals the shipped warm start was not cloned on
    in_workers = False  # a step takes ~0.05 ms: it runs in-process

    def __init__(self, data_dir: str | os.PathLike | None = None, max_steps: int = 0, seed: int = 0):
        root = Path(data_dir or os.environ.get("WEBSHOP_DATA") or SHIPPED_DATA).expanduser()
        if not root.is_dir():
            raise DataError(f"WebShop data folder not found: {root}. Pass --data-dir (or $WEBSHOP_DATA), "
                                    f"or leave both unset for the shipped catalog in {SHIPPED_DATA}.")
        self.products = load_products(_find(root, "items_shuffle*.json", "products"), _find(root, "items_ins_v2*.json", "attributes"))
        self.by_asin = {p["asin"]: p for p in self.products}
        self.prices = sample_prices(self.products, seed)
        human_path = _find(root, "items_human_ins*.json", "human goals")
        human = check_human_goals(_read_json(human_path, "human goals"), human_path)
        self.goals = make_goals(self.products, human, self.prices, seed)
        if not self.goals:
            raise DataError(f"{root}: no goal has instruction_attributes; nothing to train or test on")
        self.goal_splits = split_goals(self.goals)
        self.engine = SearchEngine(self.products)
        super().__init__(data_dir, max_steps)
        self._episodes: list[dict] = []

    # -- tasks
    def data_digest(self) -> str:
        """The tasks in one hash (a resumed run checks it trains on the data it started on): every
        goal, its product, attributes, options and price."""
        return hashlib.sha256(json.dumps(self.goals, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def tasks(self, split: str) -> list[str]:
        if split not in SPLITS:
            raise DataError(f"unknown WebShop split {split!r}: choose train or test")
        return [f"goal-{i:05d}" for i in sorted(self.goal_splits[split])]

    def goal(self, task_id: str) -> dict:
        return self.goals[int(task_id.split("-")[1])]

    def task_type(self, task_id: str) -> str:
        return self.goal(task_id)["category"] or "all"

    # -- pages
    def render(self, page: Page, goal: dict) -> tuple[str, list[str], bool]:
        """(observation text, clickables, has_search_bar) of a page, as upstream's text mode:
        each visible text stripped, joined by " [SEP] "."""
        head = ["Instruction:", goal["instruction_text"].strip()]
        if page.kind == "search":
            return SEP.join(["WebShop"] + head + ["Search"]), [], True
        if page.kind == "results":
            start = (page.page_no - 1) * PAGE_SIZE
            shown = page.results[start : start + PAGE_SIZE]
            texts = head + ["Back to Search", f"Page {page.page_no} (Total results: {len(page.results)})"]
            clicks = [BACK]
            if page.page_no > 1:
                texts.append("< Prev")
                clicks.append(PREV)
            texts.append("Next >")  # upstream shows it on every results page, past the end too
            clicks.append(NEXT)
            for asin in shown:
                texts += [asin, self.by_asin[asin]["Title"].strip(), self.by_asin[asin]["Price"]]
                clicks.append(asin.lower())
            return SEP.join(texts), clicks, False
        product = self.by_asin[page.asin]
        if page.kind == "item":
            texts, clicks = head + ["Back to Search", "< Prev"], [BACK, PREV]
            for name, values in product["options"].items():  # a group with no values: its name alone
                texts += [name] + values  # values are stripped at load
                clicks += values
            texts += [product["Title"].strip(), f"Price: {product['Price']}", f"Rating: {product['Rating']}",
                      "Description", "Features", "Reviews", "Buy Now"]
            return SEP.join(texts), list(dict.fromkeys(clicks + list(SUB_PAGES) + [BUY])), False  # each once
        if page.kind in SUB_PAGES:
            # an empty description is no text at all; an empty bullet point is an empty text, as upstream
            body = {"description": [product["Description"].strip()] if product["Description"] else [],
                    "features": [b.strip() for b in product["BulletPoints"]],
                    "reviews": []}[page.kind]  # upstream's loader reads no reviews
            return SEP.join(head + ["Back to Search", "< Prev"] + body), [BACK, PREV], False
        return SEP.join(["Thank you for shopping with us!", "Purchased", page.asin,
                         "Your score (min 0.0, max 1.0)", f"{page.score:.2f}"]), [], False

    def _transition(self, page: Page, action: str, goal: dict) -> Page:
        """The page after a valid action."""
        name, arg = parse_web_action(action)
        if name == "search":
            return Page("results", query=arg, results=self.engine.search(arg))
        if arg == BACK:
            return Page("search")
        if page.kind == "results":
            if arg == NEXT:
                return replace(page, page_no=page.page_no + 1)
            if arg == PREV:
                return replace(page, page_no=page.page_no - 1)
            return replace(page, kind="item", asin=arg.upper(), chosen={})
        if page.kind == "item":
            if arg == PREV:
                return replace(page, kind="results", asin=None, chosen={})
            if arg in SUB_PAGES:
                return replace(page, kind=arg)
            if arg == BUY:
                product = self.by_asin[page.asin]
                score = purchase_score(product, goal, self.prices[page.asin], list(page.chosen.values()))
                return replace(page, kind="done", score=score)
            # a value shown in two groups is chosen in the last of them: upstream's page maps
            # each value to its last radio button
            option = [name for name, values in self.by_asin[page.asin]["options"].items() if arg in values][-1]
            return replace(page, chosen={**page.chosen, option: arg})
        if page.kind in SUB_PAGES and arg == PREV:
            return replace(page, kind="item")
        raise AssertionError(f"unhandled valid action {action} on a {page.kind} page")

    def expert_action(self, page: Page, goal: dict) -> str | None:
        """Search the goal's words, page to the goal product, choose its options, buy."""
        if page.kind == "search":
            return f"search[{goal['words'].lower()}]"
        if page.kind == "results":
            start = (page.page_no - 1) * PAGE_SIZE
            if goal["asin"] in page.results[start : start + PAGE_SIZE]:
                return f"click[{goal['asin'].lower()}]"
            return f"click[{NEXT}]" if start + PAGE_SIZE < len(page.results) else f"click[{BACK}]"
        if page.kind == "item":
            if page.asin != goal["asin"]:
                return f"click[{PREV}]"
            for option, values in self.by_asin[page.asin]["options"].items():
                wanted = [v for v in values if any(option_match(v, g) for g in goal_option_list(goal))]
                if wanted and wanted[0] not in page.chosen.values():
                    return f"click[{wanted[0]}]"
            return f"click[{BUY}]"
        if page.kind in SUB_PAGES:
            return f"click[{PREV}]"
        return None

    def _state(self, ep: dict, reward: float, done: bool, invalid: bool, action: str | None, info: dict) -> EnvStep:
        page, goal = ep["page"], ep["goal"]
        text, clicks, search_bar = self.render(page, goal)
        ep["clickables"] = clicks
        admissible = (["search[<your query>]"] if search_bar else []) + [f"click[{c}]" for c in clicks]
        return EnvStep(text, admissible, reward, done, done and page.score == 1.0, invalid, goal["instruction_text"],
                       self.task_type(ep["task_id"]), self.expert_action(page, goal), action, info)

    # -- episodes
    def reset(self, task_ids: list[str]) -> list[EnvStep]:
        t0 = time.perf_counter()
        self._episodes = [dict(task_id=t, goal=self.goal(t), page=Page(), steps=0) for t in task_ids]
        out = [self._state(ep, 0.0, False, False, None, {}) for ep in self._episodes]
        self.seconds["reset"] += time.perf_counter() - t0
        self.counts["reset"] += len(task_ids)
        return out

    def step(self, responses: list[str | None]) -> list[EnvStep | None]:
        check_responses(responses, [ep.get("done", False) for ep in self._episodes])
        out: list[EnvStep | None] = []
        for ep, text in zip(self._episodes, responses):
            if ep.get("done"):
                out.append(None)
                continue
            action, why = parse_action(text or "", ep["clickables"])
            ep["steps"] += 1
            if action is not None:
                t0 = time.perf_counter()
                ep["page"] = self._transition(ep["page"], action, ep["goal"])
                self.seconds["step"] += time.perf_counter() - t0
                self.counts["step"] += 1
            bought = ep["page"].kind == "done"
            ep["done"] = bought or ep["steps"] >= self.max_steps
            reward = (WIN_REWARD if bought and ep["page"].score == 1.0 else 0.0) - (INVALID_PENALTY if action is None else 0.0)
            info = {"invalid_reason": why} if why else {}
            if ep["done"]:
                info["score"] = ep["page"].score if bought else 0.0
            state = self._state(ep, reward, ep["done"], action is None, action, info)
            if action is None:
                state.observation = f"Invalid action ({why}). Nothing happens. " + state.observation
            out.append(state)
        return out

    def expert_plan(self, task_id: str) -> list[str]:
        """The expert's actions from the start state: search, page to the product, options, buy."""
        goal, page, plan = self.goal(task_id), Page(), []
        while page.kind != "done" and len(plan) < self.max_steps:
            action = self.expert_action(page, goal)
            plan.append(action)
            page = self._transition(page, action, goal)
        return plan

    def build_messages(self, state: EnvStep, history: list[tuple[str, str]], history_len: int | None) -> list[dict]:
        return build_messages(state.task, history, state.observation, state.admissible, history_len)

    def valid(self, state: EnvStep, text: str) -> bool:
        clickables = [a[len("click[") : -1] for a in state.admissible if a.startswith("click[")]
        return parse_action(text, clickables)[0] is not None

    def close(self) -> None:
        self._episodes = []


def build_messages(
    task: str, history: list[tuple[str, str]], observation: str, admissible: list[str], history_len: int | None
) -> list[dict]:
    """The policy's chat context for one WebShop step (envs.step_prompt), the available actions
    listed as upstream agents list them (search[...] on the search page, then click[...] ones)."""
    intro = f"You are shopping on a web store. Your task is to: {task}"
    return step_prompt(intro, history, observation, "Available actions", admissible, "click[buy now]", history_len)
