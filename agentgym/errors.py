"""Error messages that name the bad value, the valid options and a close match."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A config value is invalid; the message names the key, the value and the fix."""


def did_you_mean(value: object, options: Iterable[object], n: int = 1) -> str:
    """``" Did you mean 'x'?"`` for the closest of ``options`` to ``value``, else ``""``.

    Matching ignores case, as Gymnasium's env-id suggestions do.
    """
    names = [str(option) for option in options]
    lowered = {name.lower(): name for name in names}
    close = difflib.get_close_matches(str(value).lower(), list(lowered), n=n, cutoff=0.6)
    if not close:
        return ""
    return " Did you mean " + " or ".join(repr(lowered[c]) for c in close) + "?"


def unknown_choice(key: str, value: object, options: Iterable[object]) -> ConfigError:
    """The error for ``key=value`` when ``value`` is not one of ``options``."""
    listed = list(options)
    return ConfigError(
        f"{key}={value!r} is not valid.{did_you_mean(value, listed)} Valid options: {listed}."
    )


def check_choice(key: str, value: str, options: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``options``.

    Raises:
        ConfigError: Naming the key, the bad value, a close match and the options.
    """
    listed = list(options)
    if value in listed:
        return value
    raise unknown_choice(key, value, listed)
