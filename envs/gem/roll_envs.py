"""ROLL's own GEM env types (``roll_math``, ``roll_qa``, ``roll_code``), on GEM's envs.

ROLL registers these names in GEM's registry (``roll/pipeline/agentic/env/__init__.py``)
for subclasses of GEM's math, QA and code envs that read their rows from a Ray actor
shared by the run's envs and report ``action_is_valid``/``success`` metrics. Here they
are GEM's envs over the rows of a local file (a seed picks the row, as ROLL's train
mode does), with the flags added:

* ``roll_math``: GEM's ``MathEnv``; a response without ``\\boxed{}`` is an invalid
  action. Graded as GEM grades (its ``boxed_reward_fn`` on the response); ROLL passes
  the already-extracted answer to that grader, which finds no ``\\boxed{}`` in it and
  scores 0 under gem-llm 0.1.0.
* ``roll_qa``: GEM's ``QaEnv``; a response without the answer (``<answer>``, or
  ``\\boxed{}`` with ``extract_boxed``) scores 0 and is an invalid action (GEM 0.1.0's
  own step raises there: it reads a variable it never set).
* ``roll_code``: GEM's ``CodeEnv`` as it is.
"""

from __future__ import annotations

from typing import Any

from gem.envs.math_env import MathEnv
from gem.envs.qa_env import QaEnv
from gem.utils.constants import TERMINAL_STATE
from gem.utils.parsing import extract_last_boxed_answer


class RollMathEnv(MathEnv):
    """ROLL's ``roll_math``: GEM's math env whose info says whether the response
    answered in ``\\boxed{}``."""

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """GEM's step, with ``action_is_valid``."""
        observation, reward, terminated, truncated, info = super().step(action)
        info["action_is_valid"] = extract_last_boxed_answer(action) is not None
        return observation, float(reward), terminated, truncated, info


class RollQaEnv(QaEnv):
    """ROLL's ``roll_qa``: GEM's QA env; no answer in the response scores 0 as an
    invalid action."""

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Extract the answer as GEM does and check it with GEM's exact match."""
        answer = self.extractor(action)
        correct = answer is not None and bool(self.check_correct(answer, self.answer))
        info = {"action_is_valid": answer is not None, "correct": correct}
        return TERMINAL_STATE, 1.0 if correct else 0.0, True, True, info
