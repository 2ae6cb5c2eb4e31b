"""Vocabularies of the synthetic WebShop catalog: product types, attributes, options.

Each category (WebShop's five: beauty, fashion, garden, electronics, grocery)
has ten product types. A type is one search ``query`` of the original data
collection, with its Amazon-style breadcrumb, the head nouns its titles use,
the attribute phrases its products may have, the option kinds it sells in and
a price range. Attribute phrases are chosen so that no two of one type are
fuzzy matches of each other (the reward's ``token_set_ratio > 85``), which is
what makes near-duplicate products distinguishable by reading.
"""

from __future__ import annotations

from dataclasses import dataclass

CATEGORIES = ("beauty", "fashion", "garden", "electronics", "grocery")


@dataclass(frozen=True)
class ProductType:
    """One product type (one WebShop ``query``).

    Attributes:
        category: One of :data:`CATEGORIES`.
        query: The search query the products were collected with.
        breadcrumb: ``product_category`` parts, outermost first.
        heads: Head noun phrases for titles (every word a noun).
        attributes: Attribute phrases products of this type may have.
        options: Keys of :data:`OPTION_POOLS` the products sell in.
        price: ``(low, high)`` dollars.
    """

    category: str
    query: str
    breadcrumb: tuple[str, ...]
    heads: tuple[str, ...]
    attributes: tuple[str, ...]
    options: tuple[str, ...]
    price: tuple[float, float]


OPTION_POOLS: dict[str, tuple[str, tuple[str, ...]]] = {
    # pool key: (option name as shown on the item page, values)
    "color": (
        "Color",
        (
            "Black",
            "White",
            "Navy Blue",
            "Heather Grey",
            "Burgundy",
            "Olive Green",
            "Light Pink",
            "Khaki",
            "Charcoal",
            "Ivory",
            "Teal",
            "Mustard Yellow",
            "Coral",
            "Lavender",
            "Beige",
            "Silver",
            "Rose Gold",
            "Brown",
            "Purple",
            "Orange",
            "Maroon",
            "Mint",
            "Turquoise",
            "Multicolor",
        ),
    ),
    "apparel_size": (
        "Size",
        ("X-Small", "Small", "Medium", "Large", "X-Large", "XX-Large", "3X-Large"),
    ),
    "shoe_size": (
        "Size",
        ("6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12", "13"),
    ),
    "volume": (
        "Size",
        ("2 Fl Oz", "4 Fl Oz", "6.8 Fl Oz", "8 Fl Oz", "12 Fl Oz", "16.9 Fl Oz", "33.8 Fl Oz"),
    ),
    "weight": (
        "Size",
        ("3 Ounce", "5.3 Ounce", "8 Ounce", "12 Ounce", "16 Ounce", "1.5 Pound", "2 Pound"),
    ),
    "pack": (
        "Item Package Quantity",
        ("1", "2", "3", "4", "6", "8", "12", "24"),
    ),
    "count": (
        "Size",
        ("10 Count", "12 Count", "24 Count", "30 Count", "48 Count", "60 Count", "100 Count"),
    ),
    "flavor": (
        "Flavor Name",
        (
            "Original",
            "Vanilla",
            "Dark Chocolate",
            "Strawberry",
            "Sea Salt",
            "Honey",
            "Cinnamon",
            "Mixed Berry",
            "Peanut Butter",
            "Lemon",
            "Mango",
            "Coconut",
            "Salted Caramel",
            "Matcha",
            "Blueberry",
        ),
    ),
    "scent": (
        "Scent",
        (
            "Lavender",
            "Unscented",
            "Fresh Linen",
            "Eucalyptus",
            "Citrus",
            "Vanilla",
            "Cedarwood",
            "Sandalwood",
            "Ocean Breeze",
            "Coconut",
            "Jasmine",
            "Peppermint",
        ),
    ),
    "style": (
        "Style",
        ("Classic", "Modern", "Compact", "Pro", "Standard", "Deluxe", "Mini", "Plus"),
    ),
    "capacity": (
        "Capacity",
        ("32GB", "64GB", "128GB", "256GB", "512GB", "1TB", "2TB"),
    ),
    "bed_size": (
        "Size",
        ("Twin", "Twin XL", "Full", "Queen", "King", "California King"),
    ),
    "rug_size": (
        "Size",
        ("2 x 3 ft", "3 x 5 ft", "4 x 6 ft", "5 x 7 ft", "6 x 9 ft", "8 x 10 ft"),
    ),
    "inch_size": (
        "Size",
        ("12 Inch", "16 Inch", "18 Inch", "20 Inch", "24 Inch", "30 Inch", "36 Inch"),
    ),
    "pattern": (
        "Pattern Name",
        ("Solid", "Striped", "Plaid", "Floral", "Geometric", "Polka Dot", "Paisley"),
    ),
    "material": (
        "Material Type",
        ("Cotton", "Linen", "Polyester", "Bamboo", "Microfiber", "Wool Blend"),
    ),
}
"""Option kinds: the name shown on the page and the values products choose from."""


def _t(
    category: str,
    query: str,
    breadcrumb: str,
    heads: str,
    attributes: str,
    options: str,
    price: tuple[float, float],
) -> ProductType:
    return ProductType(
        category=category,
        query=query,
        breadcrumb=tuple(part.strip() for part in breadcrumb.split(">")),
        heads=tuple(h.strip() for h in heads.split("|")),
        attributes=tuple(a.strip() for a in attributes.split("|")),
        options=tuple(options.split()),
        price=price,
    )


# fmt: off
PRODUCT_TYPES: tuple[ProductType, ...] = (
    # -- beauty --------------------------------------------------------------------------
    _t("beauty", "shampoo", "Beauty & Personal Care > Hair Care > Shampoo & Conditioner > Shampoos",
       "shampoo|hair shampoo|argan oil shampoo|clarifying shampoo",
       "sulfate free|paraben free|dry hair|hair growth|natural ingredients|color treated|"
       "dandruff relief|cruelty free|damaged hair|fine hair", "volume scent", (6.0, 38.0)),
    _t("beauty", "face moisturizer", "Beauty & Personal Care > Skin Care > Face > Moisturizers",
       "face moisturizer|face cream|night cream|day lotion",
       "sensitive skin|anti aging|hyaluronic acid|oil free|fine lines|dark spots|"
       "vitamin c|dermatologist tested|fragrance free|travel size", "weight scent", (9.0, 65.0)),
    _t("beauty", "hair extensions", "Beauty & Personal Care > Hair Care > Hair Extensions, Wigs "
       "& Accessories > Hair Extensions", "hair extensions|clip hair extensions|ponytail extension",
       "natural looking|heat resistant|human hair|long lasting|easy apply|synthetic fiber|"
       "double weft|thick ends", "color inch_size", (15.0, 120.0)),
    _t("beauty", "nail polish", "Beauty & Personal Care > Foot, Hand & Nail Care > Nail Art "
       "& Polish > Nail Polish", "nail polish|gel polish|nail lacquer|polish set",
       "quick dry|non toxic|long wear|high gloss|chip resistant|vegan formula|"
       "nail art|salon quality", "color pack", (5.0, 30.0)),
    _t("beauty", "deodorant", "Beauty & Personal Care > Personal Care > Deodorants "
       "& Antiperspirants > Deodorants", "deodorant|deodorant stick|antiperspirant",
       "aluminum free|baking soda free|sensitive skin|long lasting|natural ingredients|"
       "clinical strength|travel size|cruelty free", "scent weight", (4.0, 22.0)),
    _t("beauty", "makeup brush set", "Beauty & Personal Care > Tools & Accessories > Makeup "
       "Brushes & Tools > Brush Sets", "makeup brush set|brush kit|foundation brush set",
       "synthetic bristles|travel case|easy clean|soft fibers|eye shadow|cruelty free|"
       "wooden handle|professional grade", "color pack", (8.0, 45.0)),
    _t("beauty", "lip balm", "Beauty & Personal Care > Skin Care > Lip Care > Lip Balms",
       "lip balm|lip butter|lip treatment|lip oil",
       "shea butter|beeswax formula|spf protection|chapped lips|tinted finish|"
       "overnight repair|petroleum free|organic oils", "flavor pack", (3.0, 18.0)),
    _t("beauty", "body wash", "Beauty & Personal Care > Personal Care > Bath & Bathing "
       "Accessories > Bath > Body Washes", "body wash|shower gel|foaming cleanser",
       "dry skin|tea tree|exfoliating beads|moisture rich|plant based|ph balanced|"
       "soap free|gentle formula", "volume scent", (5.0, 28.0)),
    _t("beauty", "hair dryer", "Beauty & Personal Care > Hair Care > Styling Tools & Appliances "
       "> Hair Dryers & Accessories > Hair Dryers", "hair dryer|blow dryer|ionic hair dryer",
       "fast drying|low noise|ceramic tourmaline|diffuser attachment|cool shot|foldable handle|"
       "frizz control|salon grade", "color style", (19.0, 150.0)),
    _t("beauty", "perfume", "Beauty & Personal Care > Fragrance > Women's > Eau de Parfum",
       "eau de parfum|perfume|fragrance mist|cologne spray",
       "long lasting|floral notes|woody notes|gift set|travel spray|musk base|"
       "fresh citrus|alcohol free", "volume scent", (12.0, 110.0)),
    # -- fashion -------------------------------------------------------------------------
    _t("fashion", "men's t-shirt", "Clothing, Shoes & Jewelry > Men > Clothing > Shirts "
       "> T-Shirts", "t-shirt|crew neck tee|graphic tee|pocket tee",
       "machine wash|short sleeve|slim fit|cotton blend|moisture wicking|tag free|"
       "relaxed fit|pre shrunk", "color apparel_size", (8.0, 35.0)),
    _t("fashion", "women's leggings", "Clothing, Shoes & Jewelry > Women > Clothing > Leggings",
       "leggings|yoga pants|workout leggings|capri leggings",
       "high waist|tummy control|squat proof|side pockets|four way stretch|butt lift|"
       "seamless knit|ankle length", "color apparel_size", (12.0, 45.0)),
    _t("fashion", "running shoes", "Clothing, Shoes & Jewelry > Men > Shoes > Athletic "
       "> Running > Road Running", "running shoes|sneakers|trainers|road runners",
       "non slip|rubber sole|breathable mesh|arch support|lace up|memory foam|"
       "shock absorption|wide toe box", "color shoe_size", (25.0, 140.0)),
    _t("fashion", "women's dress", "Clothing, Shoes & Jewelry > Women > Clothing > Dresses "
       "> Casual", "dress|maxi dress|midi dress|sundress|wrap dress",
       "v neck|long sleeve|flowy hem|button front|elastic waist|knee length|"
       "hand wash|ruffle trim", "color apparel_size", (18.0, 70.0)),
    _t("fashion", "men's jeans", "Clothing, Shoes & Jewelry > Men > Clothing > Jeans",
       "jeans|denim jeans|straight jeans|carpenter jeans",
       "straight leg|zip fly|stretch denim|classic fit|five pocket|button closure|"
       "tapered leg|distressed wash", "color apparel_size", (20.0, 80.0)),
    _t("fashion", "hoodie", "Clothing, Shoes & Jewelry > Men > Clothing > Fashion Hoodies "
       "& Sweatshirts", "hoodie|pullover hoodie|zip hoodie|fleece sweatshirt",
       "kangaroo pocket|drawstring hood|fleece lining|ribbed cuffs|oversized fit|"
       "heavyweight cotton|thumb holes|brushed interior", "color apparel_size", (18.0, 60.0)),
    _t("fashion", "sandals", "Clothing, Shoes & Jewelry > Women > Shoes > Sandals > Flat",
       "sandals|slide sandals|flip flops|strappy sandals",
       "open toe|ankle strap|cushioned footbed|buckle closure|arch support|water friendly|"
       "vegan leather|platform heel", "color shoe_size", (12.0, 60.0)),
    _t("fashion", "backpack", "Clothing, Shoes & Jewelry > Luggage & Travel Gear > Backpacks "
       "> Casual Daypacks", "backpack|daypack|laptop backpack|rucksack",
       "laptop compartment|water resistant|usb charging port|padded straps|anti theft|"
       "large capacity|luggage strap|bottle pockets", "color style", (18.0, 90.0)),
    _t("fashion", "socks", "Clothing, Shoes & Jewelry > Men > Clothing > Socks > Athletic Socks",
       "socks|crew socks|ankle socks|compression socks",
       "cushioned sole|moisture wicking|arch compression|reinforced heel|odor control|"
       "seamless toe|merino wool|blister resistant", "color pack", (7.0, 30.0)),
    _t("fashion", "winter jacket", "Clothing, Shoes & Jewelry > Women > Clothing > Coats, "
       "Jackets & Vests > Down Jackets & Parkas", "winter jacket|puffer jacket|parka|down coat",
       "detachable hood|fleece lined|windproof shell|zipper pockets|packable design|"
       "faux fur trim|quilted panels|thermal insulation", "color apparel_size", (35.0, 180.0)),
    # -- garden (home & kitchen, patio, garden) ------------------------------------------
    _t("garden", "ottoman bench", "Home & Kitchen > Furniture > Living Room Furniture "
       "> Ottomans", "ottoman bench|storage ottoman|footstool|ottoman",
       "storage space|living room|faux leather|solid wood legs|tufted top|folding frame|"
       "easy assembly|padded seat", "color style", (30.0, 160.0)),
    _t("garden", "garden hose", "Patio, Lawn & Garden > Watering Equipment > Garden Hoses",
       "garden hose|expandable hose|water hose|hose reel",
       "kink free|brass fittings|lightweight design|burst resistant|spray nozzle|"
       "drinking water safe|uv resistant|triple latex core", "color inch_size", (15.0, 75.0)),
    _t("garden", "area rug", "Home & Kitchen > Home Decor > Area Rugs, Runners & Pads "
       "> Area Rugs", "area rug|rug|runner rug|shag rug",
       "non shedding|machine washable|stain resistant|non slip backing|low pile|"
       "living room|pet friendly|fade resistant", "color rug_size", (25.0, 220.0)),
    _t("garden", "bedspread set", "Home & Kitchen > Bedding > Quilts & Sets > Bedspreads "
       "& Coverlets", "bedspread set|quilt set|coverlet|comforter set",
       "machine wash|all season|lightweight fill|pillow shams|hypoallergenic fill|"
       "wrinkle resistant|reversible design|fade proof", "color bed_size", (30.0, 140.0)),
    _t("garden", "throw pillow covers", "Home & Kitchen > Home Decor > Decorative Pillows, "
       "Inserts & Covers > Throw Pillow Covers", "throw pillow covers|cushion covers|pillowcases",
       "hidden zipper|living room|farmhouse decor|double sided print|soft velvet|"
       "machine wash|boho style|square shape", "color pattern", (9.0, 40.0)),
    _t("garden", "planter pots", "Patio, Lawn & Garden > Gardening & Lawn Care > Pots, "
       "Planters & Container Accessories > Planters", "planter pots|flower pots|ceramic planters",
       "drainage holes|indoor plants|saucer included|frost resistant|self watering|"
       "hanging design|matte glaze|succulent garden", "color inch_size", (12.0, 70.0)),
    _t("garden", "shower curtain", "Home & Kitchen > Bath > Bathroom Accessories > Shower "
       "Curtains, Hooks & Liners > Shower Curtains", "shower curtain|curtain liner|bath curtain",
       "waterproof fabric|hooks included|weighted hem|mildew resistant|extra long|"
       "rust proof grommets|quick drying|odorless peva", "color pattern", (10.0, 45.0)),
    _t("garden", "patio chair", "Patio, Lawn & Garden > Patio Furniture & Accessories "
       "> Chairs > Dining Chairs", "patio chair|lounge chair|dining chair|rocking chair",
       "weather resistant|powder coated steel|stackable frame|all weather wicker|"
       "seat cushion|outdoor use|high back|teak wood", "color pack", (40.0, 260.0)),
    _t("garden", "bath towels", "Home & Kitchen > Bath > Towels > Bath Towels",
       "bath towels|towel set|hand towels|bath sheets",
       "highly absorbent|quick dry|turkish cotton|hotel quality|lint free|"
       "soft feel|ring spun|oeko tex certified", "color material", (15.0, 80.0)),
    _t("garden", "bookshelf", "Home & Kitchen > Furniture > Home Office Furniture > Bookcases",
       "bookshelf|bookcase|ladder shelf|display shelf",
       "solid wood|storage space|industrial style|metal frame|adjustable shelves|"
       "wall anchor|easy assembly|living room", "color style", (45.0, 250.0)),
    # -- electronics ---------------------------------------------------------------------
    _t("electronics", "usb microphone", "Electronics > Computers & Accessories > Computer "
       "Accessories & Peripherals > Audio & Video Accessories > Computer Microphones",
       "usb microphone|condenser microphone|podcast microphone|streaming microphone",
       "noise cancelling|plug and play|cardioid pattern|mute button|shock mount|"
       "gain control|pop filter|headphone jack", "color style", (25.0, 150.0)),
    _t("electronics", "car subwoofer", "Electronics > Car & Vehicle Electronics > Car "
       "Electronics > Car Audio > Subwoofers", "car subwoofer|subwoofer|bass speaker|sub enclosure",
       "high power|dual voice coil|low profile|sealed box|built in amplifier|"
       "deep bass|easy installation|remote bass knob", "style inch_size", (50.0, 350.0)),
    _t("electronics", "wireless earbuds", "Electronics > Headphones, Earbuds & Accessories "
       "> Earbuds", "wireless earbuds|earbuds|earphones|in ear headphones",
       "active noise cancellation|charging case|touch control|sweat resistant|"
       "long battery life|deep bass|voice assistant|fast charging", "color style", (20.0, 180.0)),
    _t("electronics", "hdmi cable", "Electronics > Television & Video > Accessories > Cables "
       "> HDMI Cables", "hdmi cable|hdmi cord|video cable|display cable",
       "high speed|4k hdr|braided jacket|gold plated|ethernet channel|ultra hd|"
       "flexible design|audio return channel", "color pack", (6.0, 30.0)),
    _t("electronics", "phone case", "Cell Phones & Accessories > Cases, Holsters & Sleeves "
       "> Basic Cases", "phone case|protective case|bumper case|wallet case",
       "shockproof design|card holder|kickstand stand|raised edges|wireless charging|"
       "slim profile|drop protection|screen protector", "color style", (7.0, 40.0)),
    _t("electronics", "memory card", "Electronics > Computers & Accessories > Memory Cards "
       "> Micro SD Cards", "memory card|micro sd card|sd card|flash card",
       "high speed|adapter included|4k video|waterproof build|full hd|"
       "rated a2|shock proof|lifetime warranty", "capacity pack", (8.0, 120.0)),
    _t("electronics", "bluetooth speaker", "Electronics > Portable Audio & Video > Portable "
       "Speakers & Docks > Portable Bluetooth Speakers", "bluetooth speaker|speaker|party speaker",
       "waterproof rating|stereo pairing|built in microphone|long battery life|"
       "deep bass|outdoor use|led lights|usb charging", "color style", (20.0, 160.0)),
    _t("electronics", "wall charger", "Cell Phones & Accessories > Chargers & Power Adapters "
       "> Wall Chargers", "wall charger|charging block|power adapter|charger plug",
       "fast charging|dual port|foldable plug|overheat protection|usb c|"
       "travel size|gan technology|universal compatibility", "color pack", (9.0, 50.0)),
    _t("electronics", "computer monitor", "Electronics > Computers & Accessories > Monitors",
       "computer monitor|monitor|gaming monitor|display",
       "ips panel|refresh rate|eye care|vesa mount|frameless design|adaptive sync|"
       "tilt adjustment|blue light filter", "style inch_size", (90.0, 450.0)),
    _t("electronics", "security camera", "Electronics > Camera & Photo > Video Surveillance "
       "> Surveillance Cameras > Dome Cameras", "security camera|surveillance camera|"
       "dome camera|outdoor camera", "night vision|motion detection|two way audio|"
       "cloud storage|weatherproof housing|easy setup|pan tilt|person detection",
       "color pack", (25.0, 200.0)),
    # -- grocery -------------------------------------------------------------------------
    _t("grocery", "bacon", "Grocery & Gourmet Food > Meat & Seafood > Pork > Bacon",
       "bacon|smoked bacon|bacon strips|thick cut bacon",
       "gluten free|nitrate free|sugar free|keto friendly|hardwood smoked|"
       "uncured pork|ready to eat|high protein", "weight pack", (6.0, 40.0)),
    _t("grocery", "protein bars", "Grocery & Gourmet Food > Snacks & Sweets > Snack Foods "
       "> Bars > Protein Bars", "protein bars|snack bars|energy bars|nutrition bars",
       "high protein|low sugar|gluten free|non gmo|plant based|keto friendly|"
       "soy free|whole grains", "flavor count", (10.0, 45.0)),
    _t("grocery", "ground coffee", "Grocery & Gourmet Food > Beverages > Coffee, Tea & Cocoa "
       "> Coffee > Ground Coffee", "ground coffee|coffee|espresso roast|coffee beans",
       "medium roast|dark roast|fair trade|arabica beans|usda organic|low acid|"
       "small batch|single origin", "flavor weight", (7.0, 35.0)),
    _t("grocery", "green tea", "Grocery & Gourmet Food > Beverages > Coffee, Tea & Cocoa "
       "> Tea > Green Tea", "green tea|tea bags|loose leaf tea|matcha powder",
       "caffeine free|usda organic|antioxidant rich|non gmo|individually wrapped|"
       "whole leaf|cold brew|kosher certified", "flavor count", (5.0, 30.0)),
    _t("grocery", "olive oil", "Grocery & Gourmet Food > Pantry Staples > Cooking Oils "
       "> Olive Oils", "olive oil|extra virgin olive oil|cooking oil|oil bottle",
       "cold pressed|first harvest|glass bottle|single estate|usda organic|"
       "high polyphenol|non gmo|award winning", "volume pack", (8.0, 50.0)),
    _t("grocery", "dark chocolate", "Grocery & Gourmet Food > Snacks & Sweets > Chocolate "
       "> Chocolate Bars", "dark chocolate|chocolate bar|cocoa bar|chocolate squares",
       "dairy free|fair trade|low sugar|cacao content|individually wrapped|"
       "gluten free|vegan friendly|gift box", "flavor pack", (4.0, 35.0)),
    _t("grocery", "pasta", "Grocery & Gourmet Food > Pantry Staples > Dried Grains & Rice "
       "> Pasta & Noodles", "pasta|spaghetti|penne pasta|noodles",
       "whole wheat|gluten free|high fiber|bronze cut|non gmo|chickpea flour|"
       "low carb|imported from italy", "weight pack", (3.0, 28.0)),
    _t("grocery", "trail mix", "Grocery & Gourmet Food > Snacks & Sweets > Snack Foods "
       "> Trail Mix", "trail mix|nut mix|snack mix|mixed nuts",
       "resealable bag|no added sugar|roasted nuts|individual packs|high protein|"
       "gluten free|dried fruit|lightly salted", "flavor weight", (6.0, 32.0)),
    _t("grocery", "honey", "Grocery & Gourmet Food > Pantry Staples > Jams, Jellies & Sweet "
       "Spreads > Honey", "honey|raw honey|manuka honey|honey jar",
       "raw unfiltered|usda organic|squeeze bottle|local farms|pure natural|"
       "non gmo|kosher certified|glass jar", "weight pack", (6.0, 55.0)),
    _t("grocery", "sparkling water", "Grocery & Gourmet Food > Beverages > Bottled Beverages, "
       "Water & Drink Mixes > Water > Sparkling Water", "sparkling water|seltzer water|"
       "carbonated water|mineral water", "zero calories|sugar free|natural flavors|"
       "bpa free cans|sodium free|caffeine free|recyclable packaging|artificial sweetener free",
       "flavor pack", (5.0, 30.0)),
)
# fmt: on
"""Ten product types per category."""

MATERIALS = ("premium", "durable", "everyday", "lightweight", "handcrafted", "versatile")
"""Marketing adjectives used in descriptions (never attributes or options)."""

BRAND_SYLLABLES = (
    "lu", "mo", "ra", "ve", "ti", "zan", "kor", "bel", "na", "qui", "sol", "dri", "fen",
    "gal", "hux", "jo", "kel", "mar", "nov", "pex", "ryn", "sty", "tor", "vex", "wyn",
    "yal", "zor", "cam", "dax", "elo", "fio", "gru", "hal", "ix", "jun", "kip",
)  # fmt: skip
"""Syllables combined into brand names (proper nouns, as spaCy would tag them)."""

_NON_NOUNS = (
    "and for with the of in on to a an by from men women mens womens kids unisex new "
    "high low long short soft extra ultra super heavy light non free natural organic "
    "premium durable wireless portable electric compact classic modern"
)
NON_NOUN_WORDS = frozenset(_NON_NOUNS.split())
"""Words the noun heuristic for real data never counts as nouns."""
