"""An env server for tests whose env kills the server's own process once.

``python tests/envs/http_dying_server.py MARKER --port P`` serves ``dying_sokoban``
(Sokoban as ``env=sokoban`` plays it): the first time any episode plays its second
step while the file MARKER does not exist, the env creates MARKER and sends SIGKILL
to its process, the server dying mid-episode under every episode it holds. Started
again (MARKER exists now), it serves plain Sokoban.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

from agentgym import registry
from agentgym.envs.http.serve import main
from agentgym.envs.http.server import env_config_kwargs
from agentgym.envs.sokoban import SokobanEnv

MARKER = Path(sys.argv[1])


class DyingSokoban(SokobanEnv):
    """Sokoban whose server is killed at the first second step (see the module docstring)."""

    def step(self, action: str) -> Any:
        if self.num_steps == 1 and not MARKER.exists():
            MARKER.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


def _kwargs() -> dict[str, str]:
    """Sokoban's arguments as ``env=sokoban`` trains with them, as key=value words."""
    return {key: str(value).replace(" ", "") for key, value in env_config_kwargs("sokoban").items()}


if __name__ == "__main__":
    registry.register("dying_sokoban", DyingSokoban)
    main(["dying_sokoban", *sys.argv[2:], *(f"{k}={v}" for k, v in _kwargs().items())])
