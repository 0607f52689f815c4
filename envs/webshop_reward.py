"""WebShop's purchase score: upstream WebShop's goal.py reward, with a noun approximation for r_type.

    score = r_type * (n_attr_matches + n_option_matches + [price <= price_upper])
                   / (n_attrs + n_options + 1)

  attribute match: thefuzz token_set_ratio > 85 with one of the product's attributes, or the
    goal attribute a substring of the product's title, bullet points or description;
  option match: token_set_ratio > 85 between a chosen option value and a goal option, both
    first mapped to the first colour name they contain (upstream's normalize_color);
  r_type: 1 if the query matches, or two product-category levels do, or title_score > 0.2;
    else 0.5; but 0.1 when title_score < 0.1 and 0 when it is 0.
    title_score = |type words of the goal's name shared with the product's| / |type words of the goal's|.
The fuzzy scores come from `thefuzz`, the package upstream calls, so its integer rounding before
the > 85 test and its ASCII folding are upstream's.

Deviation from upstream: upstream's type words are the NOUN / PROPN tokens spaCy's
en_core_web_sm model finds, and that model is not on the Python package index. Here:
  - the goal's type words (the denominator) are all its words but function words and numbers,
    split as spaCy splits them. On title-case product names spaCy tags nearly every such word
    PROPN, so this is close to upstream's count there, and never smaller than it on lower-case
    names, where spaCy drops the adjectives;
  - a shared word counts in the numerator only if it may be a noun: not a listed adjective,
    adverb, unit or pack word, not a participle (-ed; -ing unless a listed -ing noun), not
    formed with an adjective suffix (-less, -proof, -able/-ible, -ous, -ful, -ly).
Both choices make title_score err low: a shared adjective, adverb or unit alone never lifts
r_type, and where the approximation and spaCy disagree the approximation's r_type is the
smaller one. tests/test_webshop_reward.py lists every goal x product pair of the shipped
catalog (and of a held-out set of names) whose r_type differs from spaCy's.
"""
from __future__ import annotations

import re

from thefuzz import fuzz

# Lucene's English stop set (the analyzer upstream's Pyserini index uses); also function words here
LUCENE_STOPWORDS = frozenset("a an and are as at be but by for if in into is it no not of on or such that the their "
                             "then there these they this to was will with".split())
# words spaCy tags as adpositions, determiners, pronouns, particles...: never a type word
FUNCTION_WORDS = LUCENE_STOPWORDS | frozenset(
    "from over under without within per up down about above below after before between through via each all "
    "both any some more most other our your his her its my we you he she me us him them which who what when "
    "where how so than too very can do does has have had also only just plus".split())
# adjectives and adverbs common in product names, units, and pack words: shared, they say nothing of the type
NOT_NOUNS = frozenset("""
    black white red blue green yellow grey gray pink purple brown beige navy teal turquoise maroon burgundy
    golden multicolor multicolored clear transparent dark bright
    large small big mini tiny little long short tall high low wide narrow thick thin heavy extra super ultra
    mega full half double single
    new premium professional classic original genuine natural organic pure fresh free soft hard smooth strong
    quick fast slow easy simple deep dry wet hot cold warm cool true real best great good perfect ideal safe
    clean healthy modern cute pretty elegant casual formal comfy cozy lightweight vegan sensitive gentle mild
    hypoallergenic unscented anti non multi eco electric electronic digital magnetic automatic smart compact
    universal ceramic wooden metallic ergonomic basic athletic aromatic acoustic
    american english french german greek indian italian japanese chinese korean mexican spanish swiss thai turkish
    oz fl ml lb lbs kg mg mm cm inch inches ft hour hours
    count ct pack pcs pc piece pieces pair pairs set
""".split())
# -ing words that are nouns in product names (the rest of -ing words are taken as participles)
ING_NOUNS = frozenset("""
    clothing bedding ceiling lighting flooring filling frosting pudding seasoning dressing stuffing packaging
    building stocking legging bearing coupling fitting tubing piping railing siding molding moulding trimming
    bushing housing casing mounting wiring awning topping padding lining coating earring shelving decking
    fencing roofing netting webbing string spring running walking hiking fishing camping cycling swimming
    training climbing hunting boxing skiing bowling riding sewing baking cooking gardening painting drawing
    writing
""".split())
LY_NOUNS = frozenset("family butterfly assembly supply dragonfly firefly monopoly anomaly".split())
ABLE_NOUNS = frozenset("vegetable turntable timetable constable".split())
_SPLIT = re.compile(r"[\s/()\[\]{},;:!?\"&+|*-]+")  # spaCy splits at these (and at hyphens between words)

# Upstream normalize.py's colour names, in its order (a fact of upstream's scoring: an option value
# becomes the first of these it contains, so "light blue" and "dark blue" both become "blue",
# "navy blue" becomes "blue" but "navy" stays "navy", and "standard" becomes "tan").
COLOR_NAMES = tuple("""
    alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze brown burgundy camel
    camo caramel champagne charcoal cheetah chestnut chocolate christmas coffee cognac copper coral cranberry
    cream crystal dark denim eggplant elephant espresso fuchsia gold granite grape graphite grass gray green grey
    heather indigo ivory ivy khaki lavender lemon leopard light lilac lime magenta maroon mauve merlot midnight
    mint mocha multicolor mushroom mustard natural navy nude olive orange peach pewter pink plum purple rainbow
    red rose royal rust sand sapphire seashell silver skull slate steel stone stonewash sunflower tan taupe teal
    tiger turquoise violet walnut wheat white wine yellow
""".split())


# ----------------------------------------------------------------------------- r_type
def type_words(name: str) -> list[str]:
    """A product name's candidate type words, lowercased: tokens split as spaCy splits them
    (whitespace, slashes, brackets, commas, hyphens; a possessive 's dropped), keeping those
    with a letter that are not function words. Upstream keeps spaCy's nouns among these."""
    words = []
    for token in _SPLIT.split(name.lower()):
        token = re.sub(r"'s$|’s$", "", token).strip(".'’")
        if re.search(r"[a-z]", token) and token not in FUNCTION_WORDS:
            words.append(token)
    return words


def may_be_noun(word: str) -> bool:
    """False for a word that is (almost) never the noun naming a product type: a listed
    adjective, adverb, unit or pack word; a participle; a word with an adjective suffix."""
    if word in NOT_NOUNS:
        return False
    n = len(word)
    if word.endswith("ed") and n >= 5 and not word.endswith(("eed", "bed")):
        return False
    if word.endswith("ing") and n >= 6 and word not in ING_NOUNS:
        return False
    if word.endswith("ly") and n >= 6 and word not in LY_NOUNS:
        return False
    if word.endswith(("able", "ible")) and n >= 7 and word not in ABLE_NOUNS:
        return False
    if n >= 6 and word.endswith(("less", "proof", "ous", "ful")):
        return False
    return True


def title_score(desired_name: str, purchased_name: str) -> float:
    """Share of the goal name's type words that the purchased name shares and that may be
    nouns (module docstring); 0.2 when the goal name has no type word, as upstream."""
    desired = set(type_words(desired_name))
    if not desired:
        return 0.2
    shared = desired & set(type_words(purchased_name))
    return sum(may_be_noun(w) for w in shared) / len(desired)


def r_type_from(query_match: bool, category_match: bool, title: float) -> float:
    """upstream get_type_reward's thresholds, in its order."""
    r_type = 1.0 if (query_match or category_match or title > 0.2) else 0.5
    if title < 0.1:
        r_type = 0.1
    if title == 0.0:
        r_type = 0.0
    return r_type


def type_match(product: dict, goal: dict) -> dict:
    """upstream get_type_reward: r_type with query_match, category_match and title_score."""
    query_match = product["query"] == goal["query"]
    cats_p = {x.strip() for x in product["product_category"].split("›")}
    cats_g = {x.strip() for x in goal["product_category"].split("›")}
    category_match = len(cats_p & cats_g) >= 2  # two levels in common, in any order
    title = title_score(goal["name"], product["name"])
    return {"r_type": r_type_from(query_match, category_match, title), "query_match": query_match,
            "category_match": category_match, "title_score": title}


def type_reward(product: dict, goal: dict) -> float:
    return type_match(product, goal)["r_type"]


# ----------------------------------------------------------------------------- attributes and options
def attribute_matches(product: dict, goal: dict) -> int:
    """Goal attributes matched by one of the product's attributes (token_set_ratio > 85) or,
    failing that, found in its title, bullet points or description (read only when needed,
    as upstream: a product may lack them when every attribute matched)."""
    n = 0
    for g in goal["attributes"]:
        if any(fuzz.token_set_ratio(p, g) > 85 for p in product["Attributes"]):
            n += 1
        elif (g in product["Title"].lower() or g in " ".join(product["BulletPoints"]).lower()
              or g in product["Description"].lower()):
            n += 1
    return n


def normalize_color(option) -> str | tuple:
    """upstream normalize_color: the first colour name found in the option, else the option.
    A (name, value) pair of a synthetic goal's options is matched element-wise, as upstream's
    `in` test does on a tuple: it becomes a colour only if one of its parts is one."""
    for color in COLOR_NAMES:
        if color in option:
            return color
    return option


def option_match(chosen: str, goal_option) -> bool:
    """A chosen option value matches a goal option: token_set_ratio > 85 after normalize_color.
    (thefuzz reads a (name, value) pair as the text "name value".)"""
    return fuzz.token_set_ratio(normalize_color(chosen), normalize_color(goal_option)) > 85


def goal_option_list(goal: dict) -> list:
    """A goal's options: human goals have a list of values; upstream's synthetic goals have a
    dict {name: value}, whose (name, value) pairs upstream matches."""
    options = goal["goal_options"]
    return list(options.items()) if isinstance(options, dict) else list(options)


def option_matches(chosen: list[str], goal: dict) -> int:
    """Goal options matched by at least one chosen option value."""
    return sum(any(option_match(c, g) for c in chosen) for g in goal_option_list(goal))


def purchase_score(product: dict, goal: dict, price: float, chosen: list[str]) -> float:
    """The purchase's score in 0..1 (module docstring)."""
    r_price = 1.0 if price <= goal["price_upper"] else 0.0
    matched = attribute_matches(product, goal) + option_matches(chosen, goal) + r_price
    return type_reward(product, goal) * matched / (len(goal["attributes"]) + len(goal["goal_options"]) + 1)
