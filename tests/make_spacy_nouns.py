"""Write tests/data/webshop_spacy_nouns.json: the nouns upstream WebShop's r_type would use.

Upstream's goal.py keeps the tokens spaCy's en_core_web_sm tags NOUN or PROPN (lowercased).
That model is not on the Python package index, so the project approximates it
(envs/webshop_reward.py); this script records spaCy's answer once, for the tests that
compare the two. It needs spaCy and an en_core_web_sm model, which the project does not
install; run it in a separate environment:

    pip install spacy && python -m spacy download en_core_web_sm
    python tests/make_spacy_nouns.py [MODEL_NAME]     (default en_core_web_sm)
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "webshop_spacy_nouns.json"
CATALOG = ROOT / "data" / "webshop" / "items_shuffle.json"  # every goal's name is one of its product names

# Names used by the reward tests ported from upstream's tests/web-agent-site/engine/test_goal.py
UPSTREAM_TEST_NAMES = [
    "Name 1",
    "Mens D.O.N. Issue 2 Gca Basketball Sneakers Shoes Casual - Off White",
    "PEAK High Top Mens Basketball Shoes Lou Williams Streetball Master Breathable Non Slip Outdoor Sneakers",
    "Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD Soundbar Home Theater System Subwoofer",
    "BRST AC Power Cord Outlet Socket Cable Plug Lead for Panasonic SC-HT830V DVD/VCR Combo Home Theater System",
    "Saireed UL Listed 2 Prong Power Cord for JBL Bar 3.1 Bar 2.1 Channel 4K Ultra HD Soundbar",
    "Rusticware 921ORB Kitchen and Bath Cabinet Knob",
    "Minkissy 2pcs Stainless Steel Eyebrow Tweezers Blackhead Acne Remover Portable Makeup Tweezers (Silver)",
    "blue ceramic coffee mug",
    "blue running shoes for men",
]

# Held out: product names written for this check after the approximation's word lists were fixed
# (not used to choose them), in the style of the real catalog's Amazon titles.
HELD_OUT_NAMES = [
    "Nonstick Frying Pan 10 Inch Granite Coating Skillet with Heat Resistant Handle",
    "Stainless Steel Chef Knife 8 Inch Professional Kitchen Knife with Gift Box",
    "Electric Kettle 1.7 Liter Glass Tea Kettle with Blue LED Light, Auto Shut Off",
    "Silicone Baking Mats Set of 3 Reusable Non Stick Oven Liners",
    "Bamboo Cutting Board with Juice Groove, Extra Large",
    "Cast Iron Dutch Oven 5 Quart Enameled Pot with Lid, Red",
    "Wireless Charging Pad 15W Fast Charger for Android Phones",
    "Mechanical Gaming Keyboard RGB Backlit with Blue Switches",
    "Noise Cancelling Wireless Headphones Over Ear with Microphone",
    "4K Action Camera Waterproof Underwater Camera with Mounting Accessories Kit",
    "Smart Watch for Women Fitness Tracker with Heart Rate Monitor",
    "Portable Power Bank 20000mAh Slim External Battery Pack",
    "HDMI Cable 6 Feet High Speed Braided Cord",
    "Dog Chew Toys for Aggressive Chewers Large Breed Durable Rubber Bone",
    "Cat Litter Box Enclosed Hooded Kitty Toilet with Scoop",
    "Grain Free Dry Dog Food Chicken and Sweet Potato Recipe, 24 lb Bag",
    "Garden Hose 50 ft Expandable Water Hose with 10 Function Spray Nozzle",
    "Solar Pathway Lights Outdoor Waterproof Landscape Lighting, 8 Pack",
    "Cordless Drill Driver Kit 20V with Battery and Charger",
    "Adjustable Wrench Set 3 Piece Chrome Vanadium Steel",
    "Yoga Mat Non Slip Thick Exercise Mat for Home Workout",
    "Adjustable Dumbbells Pair 25 lb Weight Set for Strength Training",
    "Kids Bike Helmet Lightweight Multi Sport Helmet for Boys and Girls",
    "Camping Tent 4 Person Waterproof Dome Tent with Rainfly",
    "Insulated Lunch Bag for Women Leakproof Cooler Tote",
    "Women's Floral Summer Dress Short Sleeve Casual Beach Sundress",
    "Men's Slim Fit Dress Shirt Long Sleeve Wrinkle Free Button Down",
    "Unisex Knit Beanie Hat Warm Winter Cap",
    "Leather Wallet for Men RFID Blocking Bifold with Coin Pocket",
    "Polarized Sunglasses for Men and Women UV Protection",
    "Vitamin C Serum for Face with Hyaluronic Acid and Vitamin E",
    "Natural Deodorant for Women Aluminum Free Lavender Scent",
    "Electric Toothbrush Rechargeable Sonic Toothbrush with 4 Brush Heads",
    "Roasted Salted Almonds 16 oz Resealable Bag",
    "Organic Honey Raw Unfiltered Wildflower Honey 12 oz Jar",
    "Sparkling Water Variety Pack Lime Lemon Grapefruit, 12 Cans",
    "Gel Ink Pens Fine Point Black Pens for Writing, 12 Count",
    "Spiral Notebook College Ruled 3 Subject with Pockets",
    "Desk Organizer with Drawer Wooden Office Supplies Storage",
    "Memory Foam Pillow Cooling Gel Queen Size for Side Sleepers",
]


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "en_core_web_sm"
    try:
        import spacy

        nlp = spacy.load(model)
    except (ImportError, OSError) as err:  # spaCy missing, or the model not installed
        sys.exit(f"error: needs spaCy and the {model} model ({err}); see this file's docstring")
    catalog = sorted({p["name"] for p in json.loads(CATALOG.read_text())})
    nouns = lambda name: sorted({t.text.lower() for t in nlp(name) if t.pos_ in ("PNOUN", "NOUN", "PROPN")})  # noqa: E731
    out = {
        "made_with": f"spacy {spacy.__version__}, model {nlp.meta['lang']}_{nlp.meta['name']} {nlp.meta['version']}",
        "catalog": {n: nouns(n) for n in catalog},
        "upstream_tests": {n: nouns(n) for n in UPSTREAM_TEST_NAMES},
        "held_out": {n: nouns(n) for n in HELD_OUT_NAMES},
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    lines = [f'{{"made_with": {json.dumps(out["made_with"])}']
    for part in ("catalog", "upstream_tests", "held_out"):  # one name a line, for readable diffs
        rows = [f"  {json.dumps(n, ensure_ascii=False)}: {json.dumps(v)}" for n, v in out[part].items()]
        lines.append(f',\n "{part}": {{\n' + ",\n".join(rows) + "\n }")
    OUT.write_text("".join(lines) + "\n}\n")
    json.loads(OUT.read_text())  # the hand-made layout is valid JSON
    print(f"wrote {OUT}: {sum(len(v) for k, v in out.items() if k != 'made_with')} names ({out['made_with']})")


if __name__ == "__main__":
    main()
