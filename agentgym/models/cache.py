"""The tiny model, built once and cached: a folder named by a hash of its recipe (the
spec, the corpus envs, the warm start, :data:`TINY_VERSION`), written to a temporary
folder and renamed into place, so concurrent or interrupted builds never leave a
half-written model. Processes that want the same model at once (a decoupled job's
explorer and trainer started together) build it once: the others wait on a lock file
beside it and take the finished folder."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from agentgym.models.tiny import TinyModelSpec, save_tiny_model
from agentgym.models.tokenizer import build_tokenizer, env_corpus, instruction_lines

if TYPE_CHECKING:
    from agentgym.models.warmstart import WarmStartSpec


TINY_VERSION = 3
"""Bump when the corpus or the build changes, so cached models are rebuilt."""


DEFAULT_CORPUS_ENVS = ("sokoban", "frozen_lake")
"""Envs whose text trains the BPE of a model without a warm start."""

_KEY_DEFAULTS = {"history_length": 0}
"""Warm-start fields added after models were cached: in the cache key only when set
otherwise, so that the folders of earlier recipes stay valid."""


def ensure_tiny_model(
    spec: TinyModelSpec,
    cache_dir: str | Path,
    envs: Iterable[str] | None = None,
    warm_start: WarmStartSpec | None = None,
) -> Path:
    """The tiny model for ``spec``, built on first use and cached under ``cache_dir``.

    The folder name is a hash of the spec, the corpus envs, the warm start and
    :data:`TINY_VERSION`; a build goes to a temporary folder renamed into
    place, so concurrent or interrupted builds never leave a half-written model.

    Args:
        spec: The model's shape.
        cache_dir: The cache folder (``~`` is expanded).
        envs: Envs whose text trains the BPE; None: the warm start's envs (the
            envs the model will play), or :data:`DEFAULT_CORPUS_ENVS` without one.
        warm_start: Supervised warm start; None: random weights.

    Returns:
        The model folder.
    """
    import hashlib
    import json
    from dataclasses import asdict

    if envs is None:
        envs = DEFAULT_CORPUS_ENVS if warm_start is None else warm_start.envs
    envs = tuple(envs)
    recipe = None
    if warm_start is not None:
        recipe = asdict(warm_start)
        for name, default in _KEY_DEFAULTS.items():
            if recipe[name] == default:
                del recipe[name]
    key = json.dumps(
        {"spec": asdict(spec), "envs": envs, "warm_start": recipe, "version": TINY_VERSION},
        sort_keys=True,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    root = Path(cache_dir).expanduser()
    path = root / f"tiny-{digest}"
    if (path / "config.json").is_file():
        return path
    root.mkdir(parents=True, exist_ok=True)
    with _build_lock(root / f".tiny-{digest}.lock", path):
        if (path / "config.json").is_file():  # another process built it meanwhile
            return path
        _build(path, spec, envs, warm_start, digest)
    return path


@contextmanager
def _build_lock(lock_path: Path, path: Path) -> Iterator[None]:
    """Hold the build of ``path`` (an exclusive lock on ``lock_path``); says so when
    another process holds it first, and waits for it."""
    import fcntl

    with lock_path.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another process building the tiny model {path}", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # released when the file closes (or the process dies)


def _build(
    path: Path,
    spec: TinyModelSpec,
    envs: tuple[str, ...],
    warm_start: WarmStartSpec | None,
    digest: str,
) -> None:
    """Build the model in a temporary folder beside ``path`` and rename it into place."""
    import os
    import shutil
    import tempfile

    root = path.parent
    print(f"building the tiny model (once; cached as {path})", flush=True)
    building = Path(tempfile.mkdtemp(prefix=f".tiny-{digest}-", dir=root))
    try:
        phrases = instruction_lines(envs) if spec.phrase_tokens else []
        corpus = env_corpus(envs)
        tokenizer = build_tokenizer(corpus, spec.vocab_size, spec.chat_template, phrases)
        save_tiny_model(tokenizer, spec, building, warm_start)
        os.replace(building, path)
    except OSError:
        if not (path / "config.json").is_file():  # not a concurrent build that won the race
            raise
    finally:
        shutil.rmtree(building, ignore_errors=True)
