"""Episodes of envs that own their conversation (``agent.kind: native``; ROLL's
``AgentNativeStepEnvManager``).

An agent-native env keeps the conversation itself: its ``reset`` and every ``step``
hand the model its next prompt as chat messages, in the info under
:data:`~agentgym.envs.text_env.CONVERSATION_KEY`. The player renders those messages
with the policy's chat template as the step's prompt, generates, and hands the text
back to the env, step after step, until the env ends the episode or a limit does. It
records through the proxy's :class:`~agentgym.proxy.recorder.SessionRecorder`, the
env playing the agent's part: in ``step`` mode each request is one sample (the env's
messages rendered, the responses the player gave spliced back as the engine's ids,
never re-tokenized); in ``trajectory`` mode a prompt that extends the last one extends
its sample. Each step's reward is the env's reward for that step.

A limit ends the episode as the env manager's own loop ends it: ``max_length`` when the
prompt and ``max_new_tokens`` pass ``sequence_length``, ``max_turns``, ``max_actions``.
An env that hands no conversation fails its episode (``env_error``) naming the key.
"""

from __future__ import annotations

import traceback
from typing import Any

from agentgym.envs.text_env import CONVERSATION_KEY
from agentgym.proxy.recorder import ProxyError, RequestParams, SessionRecorder
from agentgym.rollout.env_manager import Assignment
from agentgym.rollout.loop import EpisodeRunner, new_trajectory
from agentgym.rollout.turns import record_step
from agentgym.rollout.workers import EnvClient
from agentgym.trajectory import Trajectory

PARAMS = RequestParams(parse_tools=False)
"""Every step samples with the run's settings; the env reads the model's text as it is."""


class NativeEpisodeError(RuntimeError):
    """An env played with ``agent.kind=native`` handed no conversation."""


class NativePlayer(EpisodeRunner):
    """Plays one episode at a time on an agent-native env (a
    :class:`~agentgym.rollout.loop.PlayerFactory` itself, as :class:`EpisodeRunner`).

    Made as :class:`EpisodeRunner` is (backend, chat, rollout config, policy version).
    """

    async def run(self, assignment: Assignment, env: EnvClient) -> Trajectory:
        """Play ``assignment`` on ``env``; a failure ends the trajectory, never raises."""
        trajectory = new_trajectory(assignment, self.config.mode, self.policy_version)
        recorder = SessionRecorder(
            self.backend,
            self.chat,
            self.config,
            group_id=assignment.group_id,
            env_index=assignment.slot.index,
            policy_version=self.policy_version,
            backend_env=env.backend_env,
            session=f"{assignment.group_id}_{assignment.slot.index}",
        )
        try:
            start = await self._env_call(
                env.reset(
                    assignment.seed, options=assignment.reset_options, frame=self._frames(env)
                ),
                env,
            )
            if start.frame is not None:
                trajectory.frames.append(start.frame)
            messages = conversation(start.info, assignment.slot.name)
        except Exception:
            trajectory.termination_reason = "env_error"
            trajectory.error = traceback.format_exc(limit=-8)
            return trajectory
        try:
            await self._play_native(env, trajectory, recorder, messages, start.tools)
        finally:
            trajectory.turns = recorder.turns
            trajectory.messages = recorder.conversation or messages
            trajectory.tools = list(start.tools)
            if trajectory.turns:
                trajectory.policy_version = trajectory.turns[0].policy_version
        return trajectory

    async def _play_native(
        self,
        env: EnvClient,
        trajectory: Trajectory,
        recorder: SessionRecorder,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]],
    ) -> None:
        config = self.config
        actions = 0
        trajectory.termination_reason = "max_turns"
        for _ in range(config.max_turns):
            try:
                reply = await recorder.chat_completion(messages, tools, PARAMS)
            except ProxyError:  # a limit (max_length) or the backend failed
                trajectory.termination_reason = recorder.ending or "generation_error"
                trajectory.error = recorder.error
                return
            turn = recorder.turns[-1]
            try:
                outcome = await self._env_call(
                    env.step(reply.content, frame=self._frames(env)), env
                )
                if not (outcome.terminated or outcome.truncated):
                    messages = conversation(outcome.info, trajectory.env_name)
            except Exception:
                trajectory.termination_reason = "env_error"
                trajectory.error = traceback.format_exc(limit=-8)
                return
            record_step(trajectory, turn, outcome)
            actions += len(turn.actions)
            if outcome.terminated or outcome.truncated:
                trajectory.termination_reason = "terminated" if outcome.terminated else "truncated"
                return
            if config.max_actions_per_traj is not None and actions >= config.max_actions_per_traj:
                trajectory.termination_reason = "max_actions"
                return


def conversation(info: dict[str, Any], env_name: str) -> list[dict[str, Any]]:
    """The messages an agent-native env handed in ``info``.

    Raises:
        NativeEpisodeError: When ``info`` has none (the env keeps no conversation).
    """
    messages = info.get(CONVERSATION_KEY)
    if not isinstance(messages, list) or not messages:
        raise NativeEpisodeError(
            f"env {env_name!r} handed no conversation (info[{CONVERSATION_KEY!r}], a list of "
            "chat messages): agent.kind=native plays envs that own their conversation, such "
            "as sokoban_native; play this env with agent.kind=env"
        )
    return messages
