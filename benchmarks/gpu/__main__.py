"""``python -m benchmarks.gpu``: see :mod:`benchmarks.gpu.cli`."""

from __future__ import annotations

from .cli import main

if __name__ == "__main__":
    main()
