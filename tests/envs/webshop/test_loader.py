"""The real-format loader, on small files written in WebShop's own schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym.envs.text_env import TEXT_CHARSET
from agentgym.envs.webshop import WebShopDataError, WebShopEnv, load_world
from agentgym.envs.webshop.catalog import Review

ITEMS = [
    {
        "asin": "B01CAFE001",
        "name": "Café Crème Espresso Beans, Dark Roast",
        "full_description": "Whole bean coffee – roasted in small batches.",
        "small_description": ["Dark roast whole beans", "Fair trade certified"],
        "pricing": "$12.99 - $18.50",
        "images": ["https://images.invalid/cafe.jpg"],
        "product_category": "Grocery & Gourmet Food › Beverages › Coffee › Whole Bean",
        "average_rating": "4.5 out of 5 stars",
        "customization_options": {
            "Size": [
                {"value": "12 Ounce", "image": None, "is_selected": False},
                {"value": "2 Pound/Bag", "image": None, "is_selected": False},
            ],
            "Flavor Name": None,
        },
        "category": "grocery",
        "query": "Coffee Beans ",
        "page": 1,
    },
    {"asin": "nan", "name": "skipped: WebShop drops asin 'nan'"},
    {"asin": "B01CAFE001", "name": "skipped: repeated asin"},
    {
        "asin": "B02TEA0002",
        "name": "Green Tea Bags",
        "full_description": "",
        "small_description": "Organic green tea",
        "pricing": "",
        "images": [],
        "product_category": "Grocery & Gourmet Food › Beverages › Tea",
        "customization_options": None,
        "category": "grocery",
        "query": "green tea",
    },
]
ATTRIBUTES = {
    "B01CAFE001": {
        "attributes": ["dark roast", "fair trade"],
        "instruction": "i want dark roast coffee beans",
        "instruction_attributes": ["dark roast"],
    }
}
HUMAN = {
    "B01CAFE001": [
        {
            "asin": "B01CAFE001",
            "instruction": "i need dark roast coffee beans in a 2 pound bag.",
            "instruction_attributes": ["dark roast"],
            "instruction_options": ["2 pound | bag"],
        }
    ]
}
REVIEWS = [
    {
        "asin": "B01CAFE001",
        "average_rating": 4.5,
        "reviews": [{"title": "Great", "stars": 5, "review": "Tasty."}],
    }
]


@pytest.fixture
def data_path(tmp_path: Path) -> Path:
    folder = tmp_path / "webshop_data"
    folder.mkdir()
    for name, value in (
        ("items_shuffle_1000.json", ITEMS),
        ("items_ins_v2_1000.json", ATTRIBUTES),
        ("items_human_ins.json", HUMAN),
        ("reviews.json", REVIEWS),
    ):
        (folder / name).write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")
    return folder


def test_products_are_read_as_webshop_reads_them(data_path: Path, tmp_path: Path) -> None:
    world = load_world(data_path=data_path, num_products=None, cache_dir=tmp_path / "cache")
    coffee, tea = world.catalog.products
    assert len(world.catalog) == 2  # 'nan' and the repeated asin are skipped
    assert coffee.options == {"size": ("12 ounce", "2 pound | bag")}  # None options dropped
    assert (coffee.pricing, coffee.price_tag) == ((12.99, 18.5), "$12.99 to $18.5")
    assert 12.99 <= world.catalog.prices[0] <= 18.5
    assert coffee.query == "coffee beans"
    assert coffee.rating == "4.5"
    assert coffee.reviews == (Review("Great", 5.0, "Tasty."),)
    assert coffee.attributes == ("dark roast", "fair trade")
    assert coffee.title_nouns == {"cafe", "creme", "espresso", "beans", "dark", "roast"}
    assert tea.bullet_points == ("Organic green tea",)
    assert (tea.pricing, tea.price_tag, world.catalog.prices[1]) == ((100.0,), "$100.0", 100.0)
    assert tea.attributes == ("DUMMY_ATTR",)
    assert tea.options == {}


def test_synthetic_goals_from_real_files(data_path: Path, tmp_path: Path) -> None:
    world = load_world(data_path=data_path, num_products=None, cache_dir=tmp_path / "cache")
    goals = sorted((world.goals[i] for i in range(len(world.goals))), key=lambda g: g.instruction)
    assert len(goals) == 2  # the coffee's two sizes; the tea has no instruction
    assert [g.options for g in goals] == [{"size": "12 ounce"}, {"size": "2 pound | bag"}]
    upper = goals[0].price_upper
    assert upper in (30.0, 40.0, 50.0)  # two of $20-$50 drawn, the larger kept
    assert goals[0].instruction == (
        "i want dark roast coffee beans with size: 12 ounce, "
        f"and price lower than {upper:.2f} dollars"
    )


@pytest.mark.parametrize("goal_source", ["synthetic", "human"])
def test_oracle_scores_one_on_real_files(data_path: Path, tmp_path: Path, goal_source: str) -> None:
    env = WebShopEnv(
        data_path=data_path,
        num_products=None,
        split="all",
        goal_source=goal_source,
        cache_dir=tmp_path / "cache",
    )
    for index in range(len(env.goal_positions)):
        observation, info = env.reset(options={"goal_index": index})
        seen = [observation]
        done = False
        while not done:
            observation, _, terminated, truncated, info = env.step(env.oracle_response())
            seen.append(observation)
            done = terminated or truncated
        assert info["score"] == 1.0 and info["success"]
        assert all(set(text) <= TEXT_CHARSET for text in seen)
    if goal_source == "human":
        assert env.goal is not None
        assert env.goal.instruction.startswith("i need dark roast coffee beans in a 2 pound bag,")
        assert env.goal.options == {"size": "2 pound | bag"}
    assert any("Cafe Creme Espresso Beans" in text for text in seen)  # accents to ASCII


def test_index_of_real_files_is_cached(data_path: Path, tmp_path: Path) -> None:
    load_world(data_path=data_path, num_products=None, cache_dir=tmp_path / "cache")
    (entry,) = (tmp_path / "cache").glob("data-*")
    assert (entry / "bm25-v1" / "agentgym_meta.json").is_file()
    assert not list((tmp_path / "cache").glob(".*"))  # no temporary leftovers


def test_missing_folder_or_files_raise(tmp_path: Path, data_path: Path) -> None:
    with pytest.raises(WebShopDataError, match="is not a directory"):
        load_world(data_path=tmp_path / "nowhere", cache_dir=tmp_path)
    (data_path / "items_ins_v2_1000.json").unlink()
    with pytest.raises(WebShopDataError, match="items_ins_v2"):
        load_world(data_path=data_path, cache_dir=tmp_path)


def test_ambiguous_or_malformed_files_raise(tmp_path: Path, data_path: Path) -> None:
    (data_path / "items_shuffle.json").write_text("[]")
    with pytest.raises(WebShopDataError, match="2 files match"):
        load_world(data_path=data_path, cache_dir=tmp_path)
    (data_path / "items_shuffle.json").unlink()
    (data_path / "items_shuffle_1000.json").write_text('{"not": "a list"}')
    with pytest.raises(WebShopDataError, match="holds a JSON dict"):
        load_world(data_path=data_path, cache_dir=tmp_path)
    (data_path / "items_shuffle_1000.json").write_text('[{"asin": "B03"}]')
    with pytest.raises(WebShopDataError, match=r"record 0 .* not in WebShop's schema"):
        load_world(data_path=data_path, cache_dir=tmp_path)
