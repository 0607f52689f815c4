"""Make the small WebShop catalog shipped in data/webshop, in upstream WebShop's raw file formats.

Writes, from the product list below (written for this project):
  items_shuffle.json   a list of products as upstream's items_shuffle_1000.json: asin, name,
                       full_description, small_description, pricing, customization_options,
                       category, query, product_category, images, average_rating
  items_ins_v2.json    {asin: {attributes, instruction, instruction_attributes}} as upstream's
                       items_ins_v2_1000.json
  items_human_ins.json {asin: [{instruction, instruction_attributes, instruction_options}]} as
                       upstream's items_human_ins.json (two goals a product)

Run: python -m envs.make_webshop_catalog [--out data/webshop]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (category, query, product category path, title, price, options, attributes, bullet points)
PRODUCTS = [
    ("beauty", "shampoo", "Beauty & Personal Care › Hair Care › Shampoo",
     "Herbal Clarity Sulfate Free Shampoo for Dry Hair with Argan Oil", "$12.99",
     {"size": ["8 fl oz", "16 fl oz"]}, ["sulfate free", "dry hair", "argan oil"],
     ["Gentle cleanse without sulfates", "Argan oil restores shine to dry hair"]),
    ("beauty", "shampoo", "Beauty & Personal Care › Hair Care › Shampoo",
     "Volume Boost Shampoo for Fine Hair, Paraben Free", "$9.50",
     {"size": ["12 fl oz", "24 fl oz"]}, ["paraben free", "fine hair"],
     ["Lifts fine hair from the root", "No parabens, no dyes"]),
    ("beauty", "hair extensions", "Beauty & Personal Care › Hair Care › Hair Extensions",
     "Clip In Hair Extensions Long Straight Natural Looking Synthetic Hairpiece", "$24.99 - $32.99",
     {"color": ["dark brown", "blonde", "black"], "length": ["18 inch", "22 inch"]}, ["natural looking", "clip in", "long"],
     ["Natural looking long straight hair", "Clip in within minutes"]),
    ("beauty", "lipstick", "Beauty & Personal Care › Makeup › Lips › Lipstick",
     "Matte Liquid Lipstick Long Lasting Waterproof Lip Color", "$7.99",
     {"color": ["ruby red", "nude pink", "berry"]}, ["long lasting", "waterproof", "matte"],
     ["Stays on for 16 hours", "Waterproof matte finish"]),
    ("beauty", "face moisturizer", "Beauty & Personal Care › Skin Care › Face › Moisturizers",
     "Hydrating Face Moisturizer with Hyaluronic Acid for Sensitive Skin, Fragrance Free", "$15.75",
     {"size": ["1.7 oz", "3.4 oz"]}, ["hyaluronic acid", "sensitive skin", "fragrance free"],
     ["Hyaluronic acid holds moisture all day", "Fragrance free for sensitive skin"]),
    ("beauty", "nail polish", "Beauty & Personal Care › Makeup › Nails › Nail Polish",
     "Quick Dry Nail Polish Set, Vegan and Cruelty Free", "$11.20",
     {"color": ["pastel set", "classic red set"]}, ["quick dry", "vegan", "cruelty free"],
     ["Dries in 60 seconds", "Vegan formula, never tested on animals"]),
    ("beauty", "shampoo", "Beauty & Personal Care › Hair Care › Shampoo",
     "Anti Dandruff Shampoo with Tea Tree Oil for Itchy Scalp", "$8.25",
     {"size": ["10 fl oz", "20 fl oz"]}, ["tea tree oil", "anti dandruff", "itchy scalp"],
     ["Tea tree oil calms an itchy scalp", "Clinically shown to reduce flakes"]),
    ("fashion", "running shoes", "Clothing, Shoes & Jewelry › Men › Shoes › Athletic › Running",
     "Men's Lightweight Running Shoes Breathable Mesh Sneakers with Non Slip Sole", "$45.00 - $52.00",
     {"size": ["9", "10", "11"], "color": ["black", "grey", "navy"]}, ["lightweight", "breathable", "non slip"],
     ["Breathable mesh upper", "Non slip rubber sole"]),
    ("fashion", "running shoes", "Clothing, Shoes & Jewelry › Women › Shoes › Athletic › Running",
     "Women's Cushioned Running Shoes Memory Foam Walking Sneakers", "$39.99",
     {"size": ["7", "8", "9"], "color": ["white", "pink"]}, ["memory foam", "cushioned", "walking"],
     ["Memory foam insole", "Cushioned for long walks and runs"]),
    ("fashion", "t-shirt", "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › T-Shirts",
     "Men's Cotton Crew Neck T-Shirt Short Sleeve Classic Fit", "$14.00",
     {"size": ["medium", "large", "x-large"], "color": ["white", "black", "olive"]}, ["cotton", "crew neck", "short sleeve"],
     ["100% cotton", "Classic fit crew neck"]),
    ("fashion", "rain jacket", "Clothing, Shoes & Jewelry › Women › Clothing › Coats & Jackets",
     "Women's Waterproof Rain Jacket Lightweight Hooded Windbreaker", "$49.90",
     {"size": ["small", "medium", "large"], "color": ["yellow", "navy"]}, ["waterproof", "hooded", "lightweight"],
     ["Waterproof shell with taped seams", "Packable hood"]),
    ("fashion", "socks", "Clothing, Shoes & Jewelry › Men › Clothing › Socks",
     "Merino Wool Hiking Socks Moisture Wicking Cushioned, 3 Pairs", "$21.00",
     {"size": ["medium", "large"]}, ["merino wool", "moisture wicking", "hiking"],
     ["Merino wool keeps feet dry", "Cushioned sole for hiking"]),
    ("fashion", "leather belt", "Clothing, Shoes & Jewelry › Men › Accessories › Belts",
     "Men's Genuine Leather Dress Belt with Silver Buckle", "$18.50",
     {"size": ["32", "34", "36"], "color": ["brown", "black"]}, ["genuine leather", "dress", "silver buckle"],
     ["Full grain genuine leather", "Brushed silver buckle"]),
    ("fashion", "yoga pants", "Clothing, Shoes & Jewelry › Women › Clothing › Active › Leggings",
     "Women's High Waist Yoga Pants with Pockets, Squat Proof Leggings", "$22.99",
     {"size": ["small", "medium", "large"], "color": ["black", "charcoal"]}, ["high waist", "pockets", "squat proof"],
     ["High waist tummy control", "Two side pockets"]),
    ("electronics", "wireless headphones", "Electronics › Headphones › Over-Ear Headphones",
     "Wireless Bluetooth Over Ear Headphones with Noise Cancelling and 40 Hour Battery", "$59.99",
     {"color": ["black", "silver"]}, ["noise cancelling", "bluetooth", "long battery life"],
     ["Active noise cancelling", "40 hour battery life"]),
    ("electronics", "wireless earbuds", "Electronics › Headphones › Earbud Headphones",
     "True Wireless Earbuds Waterproof Sports Earphones with Charging Case", "$29.99",
     {"color": ["white", "black"]}, ["waterproof", "charging case", "sports"],
     ["IPX7 waterproof for sports", "Charging case holds 4 charges"]),
    ("electronics", "usb c cable", "Electronics › Computers & Accessories › Cables › USB Cables",
     "USB C to USB C Cable Fast Charging Braided Nylon Cord", "$8.99",
     {"length": ["3 ft", "6 ft", "10 ft"]}, ["fast charging", "braided", "usb c"],
     ["100W fast charging", "Braided nylon lasts longer"]),
    ("electronics", "phone case", "Electronics › Cell Phones & Accessories › Cases",
     "Shockproof Clear Phone Case with Raised Edges for iPhone 14", "$10.49",
     {"color": ["clear", "smoke black"]}, ["shockproof", "clear", "raised edges"],
     ["Military grade drop protection", "Raised edges protect the camera"]),
    ("electronics", "wall charger", "Electronics › Cell Phones & Accessories › Chargers › Wall Chargers",
     "65W USB C Wall Charger Foldable Plug GaN Fast Charger", "$26.00",
     {"color": ["white", "black"]}, ["fast charging", "foldable", "65w"],
     ["65W GaN charges a laptop", "Foldable plug for travel"]),
    ("electronics", "bluetooth speaker", "Electronics › Portable Audio › Speakers",
     "Portable Bluetooth Speaker Waterproof with Deep Bass for Outdoor", "$35.99",
     {"color": ["blue", "black", "red"]}, ["portable", "waterproof", "deep bass"],
     ["Deep bass in a small body", "Waterproof for the beach"]),
    ("electronics", "wireless mouse", "Electronics › Computers & Accessories › Mice",
     "Silent Wireless Mouse Ergonomic with USB Receiver for Laptop", "$12.99",
     {"color": ["grey", "black"]}, ["silent", "ergonomic", "wireless"],
     ["Silent clicks", "Ergonomic shape for all day use"]),
    ("grocery", "coffee beans", "Grocery & Gourmet Food › Beverages › Coffee › Whole Coffee Beans",
     "Organic Dark Roast Whole Bean Coffee, Fair Trade", "$16.99",
     {"size": ["12 oz", "2 lb"]}, ["organic", "dark roast", "fair trade"],
     ["Organic arabica beans", "Fair trade certified"]),
    ("grocery", "green tea", "Grocery & Gourmet Food › Beverages › Tea › Green Tea",
     "Organic Japanese Green Tea Bags, Caffeine Free Option", "$6.49",
     {"flavor": ["sencha", "matcha", "genmaicha"], "size": ["20 count", "100 count"]}, ["organic", "green tea", "tea bags"],
     ["Grown in Japan", "Individually wrapped tea bags"]),
    ("grocery", "protein bars", "Grocery & Gourmet Food › Snacks › Bars › Protein Bars",
     "Gluten Free Protein Bars Low Sugar, 12 Count", "$19.99",
     {"flavor": ["chocolate peanut butter", "cookie dough", "lemon"]}, ["gluten free", "low sugar", "high protein"],
     ["20g protein per bar", "Only 2g sugar"]),
    ("grocery", "olive oil", "Grocery & Gourmet Food › Pantry › Oils › Olive Oil",
     "Extra Virgin Olive Oil Cold Pressed from Greece", "$13.80",
     {"size": ["500 ml", "1 liter"]}, ["extra virgin", "cold pressed"],
     ["First cold press", "Single origin Greek olives"]),
    ("grocery", "dark chocolate", "Grocery & Gourmet Food › Snacks › Chocolate",
     "Vegan Dark Chocolate Bar 85% Cacao, Dairy Free", "$4.25",
     {"size": ["single bar", "pack of 6"]}, ["vegan", "dairy free", "dark chocolate"],
     ["85% cacao", "Dairy free and vegan"]),
    ("grocery", "coffee beans", "Grocery & Gourmet Food › Beverages › Coffee › Whole Coffee Beans",
     "Decaf Medium Roast Whole Bean Coffee, Swiss Water Process", "$14.49",
     {"size": ["12 oz", "2 lb"]}, ["decaf", "medium roast", "whole bean"],
     ["Chemical free Swiss water decaf", "Smooth medium roast"]),
    ("home", "scented candle", "Home & Kitchen › Home Décor › Candles",
     "Soy Wax Scented Candle Lavender Long Burning in Glass Jar", "$17.00",
     {"scent": ["lavender", "vanilla", "sea salt"]}, ["soy wax", "long burning", "scented"],
     ["Natural soy wax", "Burns for 50 hours"]),
    ("home", "throw pillow", "Home & Kitchen › Bedding › Decorative Pillows",
     "Velvet Throw Pillow Covers Set of 2 for Couch, 18 x 18 Inch", "$15.99",
     {"color": ["emerald green", "mustard yellow", "grey"]}, ["velvet", "set of 2", "couch"],
     ["Soft velvet", "Hidden zipper"]),
    ("home", "coffee mug", "Home & Kitchen › Kitchen & Dining › Drinkware › Mugs",
     "Ceramic Coffee Mug 16 oz Microwave and Dishwasher Safe", "$11.00",
     {"color": ["matte black", "speckled white"]}, ["ceramic", "microwave safe", "dishwasher safe"],
     ["16 oz ceramic mug", "Microwave and dishwasher safe"]),
    ("home", "bath towels", "Home & Kitchen › Bath › Towels › Bath Towels",
     "Cotton Bath Towels Set of 4 Quick Dry Highly Absorbent", "$27.50",
     {"color": ["white", "navy", "sage"]}, ["cotton", "quick dry", "absorbent"],
     ["100% cotton terry", "Quick dry and highly absorbent"]),
    ("home", "water bottle", "Home & Kitchen › Kitchen & Dining › Travel & To-Go Drinkware",
     "Insulated Stainless Steel Water Bottle 32 oz BPA Free", "$19.95",
     {"color": ["black", "teal", "white"], "size": ["24 oz", "32 oz"]}, ["insulated", "stainless steel", "bpa free"],
     ["Keeps drinks cold 24 hours", "BPA free lid"]),
    ("home", "scented candle", "Home & Kitchen › Home Décor › Candles",
     "Beeswax Pillar Candle Unscented Smokeless", "$13.25",
     {"size": ["3 inch", "6 inch"]}, ["beeswax", "unscented", "smokeless"],
     ["Pure beeswax", "Clean smokeless burn"]),
    ("home", "shower curtain", "Home & Kitchen › Bath › Shower Curtains",
     "Waterproof Fabric Shower Curtain Machine Washable with Hooks", "$16.40",
     {"color": ["white", "striped blue"]}, ["waterproof", "machine washable", "hooks"],
     ["Waterproof polyester fabric", "12 hooks included"]),
]

PHRASES = ["i need", "i am looking for", "find me", "i want to buy", "i would like"]


def asin_of(k: int) -> str:
    return f"B0SHRP{k:04d}"


def product_record(k: int, spec) -> dict:
    category, query, path, title, price, options, attributes, bullets = spec
    return {
        "asin": asin_of(k),
        "name": title,
        "full_description": f"{title}. " + " ".join(b + "." for b in bullets) + f" Made for everyday use in the {category} aisle.",
        "small_description": bullets,
        "pricing": price,
        "customization_options": {name: [{"value": v.title() if name == "color" else v, "image": None} for v in values]
                                  for name, values in options.items()},
        "category": category,
        "query": query,
        "product_category": path,
        "images": [f"https://example.invalid/{asin_of(k)}.jpg"],
        "average_rating": round(3.5 + (k % 15) / 10, 1),
    }


def goals_for(k: int, spec) -> list[dict]:
    """Two human-style goals a product: different attribute subsets and option choices."""
    category, query, path, title, price, options, attributes, bullets = spec
    names = sorted(options)
    goals = []
    for j in range(2):
        picked = {n: options[n][(j + k) % len(options[n])] for n in names}
        attrs = attributes[: 2 + j] if len(attributes) > 2 else attributes
        noun = query if j == 0 else title.split(" with ")[0].split(",")[0].lower()
        option_text = " and ".join(f"{v} {n}" if n in ("color", "flavor", "scent") else f"size {v}" if n == "size" else f"{v}"
                                   for n, v in picked.items())
        text = f"{PHRASES[(k + j) % len(PHRASES)]} {' and '.join(attrs)} {noun}" + (f" in {option_text}" if option_text else "")
        goals.append({"instruction": text, "instruction_attributes": attrs,
                      "instruction_options": [v for v in picked.values()]})
    return goals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "data" / "webshop"))
    out = Path(ap.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    products = [product_record(k, spec) for k, spec in enumerate(PRODUCTS)]
    ins = {asin_of(k): {"attributes": spec[6], "instruction": goals_for(k, spec)[0]["instruction"],
                        "instruction_attributes": spec[6][:2]} for k, spec in enumerate(PRODUCTS)}
    human = {asin_of(k): goals_for(k, spec) for k, spec in enumerate(PRODUCTS)}
    (out / "items_shuffle.json").write_text(json.dumps(products, indent=1))
    (out / "items_ins_v2.json").write_text(json.dumps(ins, indent=1))
    (out / "items_human_ins.json").write_text(json.dumps(human, indent=1))
    print(f"wrote {len(products)} products and {sum(len(g) for g in human.values())} goals to {out}")


if __name__ == "__main__":
    main()
