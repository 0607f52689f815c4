"""Make the small ALFWorld games shipped in data/alfworld (our own rooms, the real engine's format).

Each game is a PDDL problem for the ALFRED domain that the `alfworld` package ships
(`alfworld.info.ALFRED_PDDL_PATH`), with the package's 2.1.2 text grammar whose goal line is
filled by `alfworld.agents.utils.misc.add_task_to_grammar`, in the layout `alfworld-download`
produces: json_2.1.1/<split>/<task folder>/<trial>/{traj_data.json, game.tw-pddl}.
The rooms are small (2-3 receptacles) so that an agent can win in a few steps (six games in
3-4 steps); the walkthrough stored in game.tw-pddl is a shortest plan from the start state,
found by the package's PDDL planner (fast-downward) and checked here on the engine.

Run: python -m envs.make_alfworld_games [--out data/alfworld]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if sys.path and Path(sys.path[0]).resolve() == ROOT / "envs":  # run as a file: envs/alfworld.py would shadow
    sys.path[0] = str(ROOT)  # the alfworld package, so import from the project root instead

# Object classes: which can be picked up, and which can be cleaned / heated / cooled.
FOOD = {"Apple", "Potato", "Tomato", "Egg", "Bread", "Lettuce"}
DISHES = {"Mug", "Cup", "Bowl", "Plate", "Pot", "Pan"}
CLEANABLE = FOOD | DISHES | {"Fork", "Spoon", "Knife", "ButterKnife", "Spatula", "Cloth", "DishSponge"}
HEATABLE = FOOD | DISHES
COOLABLE = FOOD | DISHES | {"WineBottle"}
RECEPTACLE_OBJECTS = DISHES
NOT_PICKUPABLE = {"DeskLamp", "FloorLamp", "Sink"}
OPENABLE = {"Cabinet", "Drawer", "Fridge", "Microwave", "Safe"}

# One dict per game: split, task type, targets (ALFRED's pddl_params) and the room:
# a list of (receptacle class, [object classes inside it]).
GAMES = [
    dict(split="train", task_type="pick_and_place_simple", obj="Mug", parent="CoffeeMachine",
         room=[("CounterTop", ["Mug", "Apple"]), ("CoffeeMachine", []), ("Cabinet", ["Plate"])]),
    dict(split="train", task_type="pick_and_place_simple", obj="Book", parent="Shelf",
         room=[("Bed", ["Book", "Pillow"]), ("Shelf", ["Vase"])]),
    dict(split="train", task_type="look_at_obj_in_light", obj="Book", toggle="DeskLamp",
         room=[("SideTable", ["Book", "DeskLamp"]), ("Bed", ["Pillow"]), ("Drawer", ["Pen"])]),
    dict(split="train", task_type="pick_clean_then_place_in_recep", obj="Plate", parent="CounterTop",
         room=[("DiningTable", ["Plate", "Bread"]), ("SinkBasin", []), ("CounterTop", ["Spoon"])]),
    dict(split="train", task_type="pick_heat_then_place_in_recep", obj="Potato", parent="DiningTable",
         room=[("CounterTop", ["Potato"]), ("Microwave", []), ("DiningTable", ["Fork"])]),
    dict(split="train", task_type="pick_cool_then_place_in_recep", obj="Tomato", parent="CounterTop",
         room=[("DiningTable", ["Tomato", "Cup"]), ("Fridge", ["Egg"]), ("CounterTop", [])]),
    dict(split="train", task_type="pick_two_obj_and_place", obj="CD", parent="Drawer",
         room=[("Desk", ["CD", "CD", "Pencil"]), ("Drawer", []), ("Shelf", ["AlarmClock"])]),
    dict(split="train", task_type="pick_and_place_simple", obj="KeyChain", parent="Sofa",
         room=[("Sofa", ["Pillow"]), ("CoffeeTable", ["KeyChain", "RemoteControl"])]),
    dict(split="valid_unseen", task_type="pick_and_place_simple", obj="Apple", parent="Fridge",
         room=[("DiningTable", ["Apple", "Bowl"]), ("Fridge", []), ("CounterTop", ["Knife"])]),
    dict(split="valid_unseen", task_type="pick_heat_then_place_in_recep", obj="Egg", parent="CounterTop",
         room=[("Fridge", ["Egg", "Lettuce"]), ("Microwave", []), ("CounterTop", [])]),
    dict(split="valid_unseen", task_type="look_at_obj_in_light", obj="AlarmClock", toggle="DeskLamp",
         room=[("Desk", ["AlarmClock", "DeskLamp"]), ("Shelf", ["Book"])]),
    # valid_seen: our own held-out games (the same object and receptacle classes as train, other
    # rooms and targets), for measurements on games the warm start never saw (tools/credit.py, tools/warmstart.py --check)
    dict(split="valid_seen", task_type="pick_and_place_simple", obj="Pen", parent="Drawer",
         room=[("Desk", ["Pen", "Pencil"]), ("Drawer", []), ("Shelf", ["Book"])]),
    dict(split="valid_seen", task_type="pick_and_place_simple", obj="Cup", parent="CounterTop",
         room=[("DiningTable", ["Cup", "Apple"]), ("CounterTop", []), ("Cabinet", ["Bowl"])]),
    dict(split="valid_seen", task_type="pick_and_place_simple", obj="Pillow", parent="Sofa",
         room=[("Bed", ["Pillow"]), ("Sofa", []), ("ArmChair", ["KeyChain"])]),
    dict(split="valid_seen", task_type="look_at_obj_in_light", obj="Pen", toggle="DeskLamp",
         room=[("Desk", ["Pen", "DeskLamp"]), ("Bed", ["Pillow"])]),
    dict(split="valid_seen", task_type="look_at_obj_in_light", obj="CD", toggle="DeskLamp",
         room=[("SideTable", ["DeskLamp"]), ("Shelf", ["CD"]), ("Drawer", [])]),
    dict(split="valid_seen", task_type="pick_clean_then_place_in_recep", obj="Fork", parent="DiningTable",
         room=[("CounterTop", ["Fork"]), ("SinkBasin", []), ("DiningTable", [])]),
    dict(split="valid_seen", task_type="pick_clean_then_place_in_recep", obj="Bowl", parent="Shelf",
         room=[("CounterTop", ["Bowl", "Knife"]), ("SinkBasin", []), ("Shelf", [])]),
    dict(split="valid_seen", task_type="pick_heat_then_place_in_recep", obj="Mug", parent="CounterTop",
         room=[("DiningTable", ["Mug"]), ("Microwave", []), ("CounterTop", [])]),
    dict(split="valid_seen", task_type="pick_heat_then_place_in_recep", obj="Bread", parent="DiningTable",
         room=[("CounterTop", ["Bread"]), ("Microwave", []), ("DiningTable", ["Plate"])]),
    dict(split="valid_seen", task_type="pick_cool_then_place_in_recep", obj="Apple", parent="DiningTable",
         room=[("CounterTop", ["Apple"]), ("Fridge", []), ("DiningTable", ["Cup"])]),
    dict(split="valid_seen", task_type="pick_cool_then_place_in_recep", obj="WineBottle", parent="CounterTop",
         room=[("DiningTable", ["WineBottle"]), ("Fridge", ["Egg"]), ("CounterTop", [])]),
    dict(split="valid_seen", task_type="pick_two_obj_and_place", obj="Book", parent="Shelf",
         room=[("Bed", ["Book", "Book"]), ("Shelf", []), ("Desk", ["Pen"])]),
]


def _mangle(cls: str, k: int) -> str:
    """An ALFRED-style instance id (class|x|y|z) that the engine's demangler turns into 'cls n'."""
    return f"{cls}_bar__plus_0{k // 10}_dot_{k % 10}0_bar__plus_00_dot_50_bar__minus_01_dot_{k:02d}"


def _goal(game: dict) -> str:
    o, p, t = game["obj"], game.get("parent", ""), game.get("toggle", "")
    state = {"pick_clean_then_place_in_recep": ("cleanable", "isClean"),
             "pick_heat_then_place_in_recep": ("heatable", "isHot"),
             "pick_cool_then_place_in_recep": ("coolable", "isCool")}
    tt = game["task_type"]
    if tt == "pick_and_place_simple":
        body = f"(inReceptacle ?o ?r) (objectType ?o {o}Type) (receptacleType ?r {p}Type)"
        return f"(exists (?r - receptacle) (exists (?o - object) (and {body})))"
    if tt in state:
        able, done = state[tt]
        body = f"({able} ?o) (objectType ?o {o}Type) (receptacleType ?r {p}Type) ({done} ?o) (inReceptacle ?o ?r)"
        return f"(exists (?r - receptacle) (exists (?o - object) (and {body})))"
    if tt == "look_at_obj_in_light":
        lamp = (f"(exists (?ot - object ?r - receptacle ?a - agent ?l - location) (and (objectType ?ot {t}Type) "
                f"(toggleable ?ot) (isToggled ?ot) (receptacleAtLocation ?r ?l) (atLocation ?a ?l) (inReceptacle ?ot ?r)))")
        held = f"(exists (?o - object ?a - agent) (and (objectType ?o {o}Type) (holds ?a ?o)))"
        return f"(and {lamp} {held})"
    if tt == "pick_two_obj_and_place":
        second = (f"(exists (?o2 - object) (and (not (= ?o1 ?o2)) (objectType ?o2 {o}Type) "
                  f"(receptacleType ?r {p}Type) (inReceptacle ?o2 ?r)))")
        body = f"(objectType ?o1 {o}Type) (receptacleType ?r {p}Type) (inReceptacle ?o1 ?r) {second}"
        return f"(exists (?r - receptacle) (exists (?o1 - object) (and {body})))"
    raise ValueError(f"unknown task type {tt}")


def pddl_problem(game: dict, name: str) -> str:
    """The PDDL problem text for one game spec."""
    objects, init = ["agent1 - agent"], []
    otypes, rtypes, k = set(), set(), 0
    start = "loc_bar_0_bar_0_bar_0_bar_30"  # the middle of the room
    objects.append(f"{start} - location")
    init.append(f"(atLocation agent1 {start})")
    placed = []  # (object id, class, receptacle id, location)
    for j, (rcls, contents) in enumerate(game["room"]):
        k += 1
        rid = _mangle("Sink", k) + "_bar_SinkBasin" if rcls == "SinkBasin" else _mangle(rcls, k)
        loc = f"loc_bar_{j + 1}_bar_{2 * j + 1}_bar_{j % 4}_bar_30"
        rtypes.add(rcls)
        objects += [f"{rid} - receptacle", f"{loc} - location"]
        init += [f"(receptacleType {rid} {rcls}Type)", f"(receptacleAtLocation {rid} {loc})"]
        if rcls in OPENABLE:
            init.append(f"(openable {rid})")
        for ocls in contents:
            k += 1
            placed.append((_mangle(ocls, k), ocls, rid, loc))
    for oid, ocls, rid, loc in placed:
        otypes.add(ocls)
        objects.append(f"{oid} - object")
        init += [f"(objectType {oid} {ocls}Type)", f"(inReceptacle {oid} {rid})", f"(objectAtLocation {oid} {loc})"]
        if ocls not in NOT_PICKUPABLE:
            init.append(f"(pickupable {oid})")
        if ocls == "DeskLamp":
            init.append(f"(toggleable {oid})")
        for prop, members in [("cleanable", CLEANABLE), ("heatable", HEATABLE), ("coolable", COOLABLE),
                              ("isReceptacleObject", RECEPTACLE_OBJECTS)]:
            if ocls in members:
                init.append(f"({prop} {oid})")
    for r in sorted(rtypes):  # any receptacle can hold any portable object of this room
        init += [f"(canContain {r}Type {o}Type)" for o in sorted(otypes - NOT_PICKUPABLE)]
    objects += [f"{o}Type - otype" for o in sorted(otypes)] + [f"{r}Type - rtype" for r in sorted(rtypes)]
    nl = "\n        "
    return (f"(define (problem {name})\n(:domain alfred)\n(:objects\n        {nl.join(objects)}\n        )\n"
            f"(:init\n        {nl.join(init)}\n        )\n(:goal\n        (and {_goal(game)})\n        )\n)\n")


def traj_data(game: dict, trial: str) -> dict:
    """The traj_data.json fields the engine and the handcoded expert read."""
    return {
        "task_id": trial,
        "task_type": game["task_type"],
        "pddl_params": {"mrecep_target": "", "object_sliced": False, "object_target": game["obj"],
                        "parent_target": game.get("parent", ""), "toggle_target": game.get("toggle", "")},
        "turk_annotations": {"anns": []},
        "scene": {"floor_plan": "sharpo-shipped"},
    }


def folder_name(game: dict, index: int) -> str:
    return f"{game['task_type']}-{game['obj']}-None-{game.get('parent') or game.get('toggle')}-{900 + index}"


# The learning set (data/alfworld-learn): rooms drawn at random from these classes, for the two
# short task families (plans of 3-4 steps), so that a 135M model can learn on 2 cores in minutes.
# train (RL) and valid_seen (held out) are drawn from the same classes, and so are the games of
# data/alfworld-learn-warmstart (its split train), on which the learning set's warm start is
# cloned; no room appears twice across the three.
LEARN_OBJECTS = ("Mug", "Apple", "Book", "KeyChain", "Pen", "Pencil", "CD", "Cup", "Bowl", "Plate", "Pillow",
                 "RemoteControl", "Vase", "Fork", "Spoon", "Tomato", "Potato", "Egg", "Bread", "AlarmClock",
                 "CellPhone", "CreditCard", "Watch", "Candle", "SoapBar", "Newspaper")
LEARN_RECEPTACLES = ("CounterTop", "DiningTable", "Shelf", "Desk", "SideTable", "Bed", "Sofa", "ArmChair",
                     "CoffeeTable", "Dresser", "TVStand", "GarbageCan", "Ottoman")
LEARN_SPLITS = {"train": 64, "valid_seen": 32, "warmstart": 16}  # games per split ("warmstart": its own folder)
LEARN_FAMILIES = ("pick_and_place_simple", "look_at_obj_in_light")


def random_game(rng: random.Random, split: str, task_type: str) -> dict:
    """One room of 2-3 open receptacles: the target object on one, a distractor or two, and the
    place to put it (pick_and_place_simple) or a desk lamp (look_at_obj_in_light) on another."""
    recs = rng.sample(LEARN_RECEPTACLES, rng.choice((2, 3)))
    obj = rng.choice(LEARN_OBJECTS)
    room = {r: [] for r in recs}
    room[recs[0]].append(obj)
    for r in recs:  # distractors: other classes, so the target is never ambiguous
        if rng.random() < 0.6:
            room[r].append(rng.choice([o for o in LEARN_OBJECTS if o != obj]))
    game = dict(split=split, task_type=task_type, obj=obj)
    if task_type == "pick_and_place_simple":
        game["parent"] = recs[1]
    else:
        game["toggle"] = "DeskLamp"
        room[rng.choice(recs)].append("DeskLamp")
    for r in room.values():
        rng.shuffle(r)
    game["room"] = [(r, room[r]) for r in rng.sample(recs, len(recs))]  # the target is not always first
    return game


def learn_games(seed: int = 0) -> list[dict]:
    """LEARN_SPLITS games, half of each family per split, every room distinct across splits."""
    rng, seen, games = random.Random(seed), set(), []
    for split, n in LEARN_SPLITS.items():
        for i in range(n):
            while True:
                game = random_game(rng, split, LEARN_FAMILIES[i % len(LEARN_FAMILIES)])
                key = json.dumps([game["task_type"], game["obj"], game.get("parent"), game["room"]])
                if key not in seen:
                    seen.add(key)
                    games.append(game)
                    break
    return games


def write_games(games: list[dict], out: Path, stamp: str) -> None:
    """Write each game folder under out/json_2.1.1, with a planner walkthrough checked on the engine."""
    os.environ.setdefault("ALFWORLD_DATA", str(out))  # keep alfworld from creating ~/.cache/alfworld
    import alfworld.info
    from alfworld.agents.utils.misc import add_task_to_grammar

    from envs.alfworld import planner_plans, replay

    domain = Path(alfworld.info.ALFRED_PDDL_PATH).read_text(encoding="utf-8")
    grammar = Path(alfworld.info.ALFRED_TWL2_PATH).read_text(encoding="utf-8")
    base = out / "json_2.1.1"
    if base.exists():
        shutil.rmtree(base)
    for i, game in enumerate(games):
        trial = f"trial_{stamp}_{i:06d}_sharpo"
        folder = base / game["split"] / folder_name(game, i) / trial
        folder.mkdir(parents=True)
        traj = traj_data(game, trial)
        (folder / "traj_data.json").write_text(json.dumps(traj, indent=1))
        gamedata = {"pddl_domain": domain, "grammar": add_task_to_grammar(grammar, traj, rng=random.Random(i)),  # the goal's wording, per game
                    "pddl_problem": pddl_problem(game, f"plan_{trial}"), "solvable": True, "walkthrough": []}
        (folder / "game.tw-pddl").write_text(json.dumps(gamedata))
        plan = planner_plans(str(folder / "game.tw-pddl"), [])[0] or []  # a shortest plan from the start
        won = bool(plan) and replay(str(folder / "game.tw-pddl"), plan)
        gamedata["solvable"], gamedata["walkthrough"] = won, plan
        (folder / "game.tw-pddl").write_text(json.dumps(gamedata))
        print(f"{'won ' if won else 'LOST'} {len(plan):2d} steps  {folder.relative_to(base)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=("shipped", "learn"), default="shipped",
                    help="shipped: the hand-made games of data/alfworld; learn: the random rooms of data/alfworld-learn")
    ap.add_argument("--out", default=None, help="data folder (json_2.1.1 goes inside); default: data/alfworld[-learn]")
    args = ap.parse_args()
    if args.set == "shipped":
        write_games(GAMES, Path(args.out or ROOT / "data" / "alfworld"), "T20261130")
    else:
        out = Path(args.out or ROOT / "data" / "alfworld-learn")
        games = learn_games()
        write_games([g for g in games if g["split"] != "warmstart"], out, "L20261201")
        warm = [{**g, "split": "train"} for g in games if g["split"] == "warmstart"]
        write_games(warm, out.with_name(out.name + "-warmstart"), "W20261201")


if __name__ == "__main__":
    main()
