"""WebShop offline: a generated catalog in WebShop's schema, BM25 search, WebShop's score."""

from agentgym.envs.webshop.catalog import Catalog, Product, WebShopDataError, build_catalog
from agentgym.envs.webshop.env import WebShopEnv
from agentgym.envs.webshop.generator import GENERATOR_VERSION, RawCatalog, generate_catalog
from agentgym.envs.webshop.goals import SPLITS, Goal, GoalSet, WebShopConfigError
from agentgym.envs.webshop.reward import GoalSpec, RewardBreakdown, score_purchase
from agentgym.envs.webshop.search import SearchEngine, document_text
from agentgym.envs.webshop.world import World, load_world

__all__ = [
    "GENERATOR_VERSION",
    "SPLITS",
    "Catalog",
    "Goal",
    "GoalSet",
    "GoalSpec",
    "Product",
    "RawCatalog",
    "RewardBreakdown",
    "SearchEngine",
    "WebShopConfigError",
    "WebShopDataError",
    "WebShopEnv",
    "World",
    "build_catalog",
    "document_text",
    "generate_catalog",
    "load_world",
    "score_purchase",
]
