"""Each env a run will play, built and reset once before any model work, so that
arguments an env rejects fail in seconds, naming the env and the argument."""

from __future__ import annotations

import re
import traceback

from agentgym.envs.adapter import make_text_env
from agentgym.errors import ConfigError
from agentgym.registry import UnknownEnvArgumentError
from agentgym.schema import TrainConfig


def check_envs(config: TrainConfig) -> None:
    """Build each env the run will play (every tag of both env managers, with its
    arguments) and reset it once, so that arguments an env rejects fail in seconds,
    before any model work, instead of as failed episodes.

    Raises:
        ConfigError: Naming the env, the arguments its message mentions (all of
            them when it mentions none) and the env's own message.
    """
    checked: set[str] = set()
    for key, section in (
        ("train_env_manager", config.train_env_manager),
        ("val_env_manager", config.val_env_manager),
    ):
        for tag in section.tags:
            entry = section.env_configs.get(tag)
            name, kwargs = tag, dict(config.env.kwargs)
            where = "env.kwargs"
            if entry is not None:
                name = entry.get("name", tag)
                kwargs = dict(entry.get("kwargs") or {})
                where = f"{key}.env_configs.{tag}.kwargs"
            if section.format_penalty is not None:
                kwargs["format_penalty"] = section.format_penalty
            fingerprint = repr((name, sorted(kwargs.items(), key=str)))
            if fingerprint in checked:
                continue
            checked.add(fingerprint)
            try:
                env = make_text_env(name, kwargs)
                try:
                    env.reset(seed=config.seed)
                finally:
                    env.close()
            except UnknownEnvArgumentError as error:  # a misspelt key: the key, no traceback
                raise ConfigError(
                    f"{where}.{error.argument}: env {name!r} takes no argument "
                    f"{error.argument!r}.{error.hint} Its arguments: {', '.join(error.valid)}"
                ) from None
            except Exception as error:
                message = str(error) or type(error).__name__
                named = [k for k in kwargs if re.search(rf"\b{re.escape(str(k))}\b", message)]
                given = ", ".join(f"{where}.{k}={kwargs[k]!r}" for k in named or kwargs)
                where_raised = "".join(traceback.format_exception(error, limit=-3))
                raise ConfigError(
                    f"env {name!r} rejects its arguments ({given or 'none given'}): "
                    f"{type(error).__name__}: {message}\n{where_raised.rstrip()}"
                ) from None
