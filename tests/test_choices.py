"""The config's choice lists live in one leaf module: checking a config imports no torch,
and every table that implements a choice holds exactly the names the schema accepts."""

from __future__ import annotations

import subprocess
import sys

from agentgym import choices


def test_validating_a_composed_config_imports_no_torch() -> None:
    script = (
        "import sys\n"
        "import agentgym.schema\n"
        "assert 'torch' not in sys.modules, 'import agentgym.schema imported torch'\n"
        "from hydra import compose, initialize_config_module\n"
        "from omegaconf import OmegaConf\n"
        "with initialize_config_module('agentgym.configs', version_base=None):\n"
        "    cfg = compose('config', overrides=['env=frozen_lake', 'adv_estimator=gae'])\n"
        "agentgym.schema.validate(OmegaConf.to_container(cfg, resolve=True))\n"
        "leaked = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "assert not leaked, leaked[:5]\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]


def test_every_implementation_table_holds_the_names_the_schema_accepts() -> None:
    from agentgym.trainers import advantages, correction, losses, normalization, pg_variants
    from agentgym.trainers.strategies import CRITIC_STRATEGIES, STRATEGIES
    from agentgym.trainers.strategies.optim import LR_SCHEDULERS

    assert tuple(LR_SCHEDULERS) == choices.LR_SCHEDULER_TYPES
    assert tuple(STRATEGIES) == choices.STRATEGY_NAMES
    assert tuple(CRITIC_STRATEGIES) == choices.CRITIC_STRATEGY_NAMES
    assert not set(STRATEGIES) & set(choices.UNSUPPORTED_STRATEGIES)
    # gae is the critic's estimator (trainers/gae.py); the others are registered
    assert {*advantages.ADVANTAGE_ESTIMATORS, "gae"} >= set(choices.ADVANTAGE_ESTIMATORS)
    assert tuple(normalization._GROUPERS) == choices.GROUPINGS
    assert tuple(normalization._NORMALIZERS) == choices.NORMALIZATIONS
    assert tuple(losses._AGGREGATORS) == choices.LOSS_AGG_MODES
    assert tuple(pg_variants.PG_VARIANTS) == choices.PG_VARIANTS
    assert correction.WEIGHT_TYPES is choices.WEIGHT_TYPES
