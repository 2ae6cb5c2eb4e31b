"""The OpenAI-compatible proxy: token-exact recording against the env manager's own
loop, the official openai client against the server, bad requests, and agents that
fail."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym.proxy.players import AgentSettings, ProxyPlayers
from agentgym.proxy.recorder import SessionRecorder
from agentgym.proxy.runners import AgentResult, AgentTask, EnvRunner
from agentgym.proxy.server import ProxyServer
from agentgym.rollout.backends.base import Generation, SamplingParams
from agentgym.rollout.backends.hf import HFBackend
from agentgym.rollout.backends.scripted import ScriptedBackend
from agentgym.rollout.chat import ChatTokenizer
from agentgym.rollout.env_manager import EnvManager
from agentgym.rollout.loop import RolloutConfig, RolloutResult, collect
from agentgym.trajectory import RolloutBatch
from tests.envs.trainrun import logged_steps, train_two_steps
from tests.rollout.envs import AddToolEnv, registered


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def backend(tiny_model_dir: Path, tokenizer: Any) -> HFBackend:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    return HFBackend(model, pad_token_id=tokenizer.pad_token_id)


def config(mode: str = "trajectory", **changes: Any) -> RolloutConfig:
    settings: dict[str, Any] = {
        "mode": mode,
        "max_turns": 3,
        "sequence_length": 4096,
        "history_length": 2,
        "sampling": SamplingParams(max_new_tokens=12, seed=0),
        "prefix_check": "off",
    }
    return RolloutConfig(**(settings | changes))


def play(
    backend: Any, tokenizer: Any, rollout: RolloutConfig, players: Any, groups: int = 2
) -> RolloutResult:
    manager = EnvManager(tags=["sokoban"], env_groups=groups, group_size=2, seed=5)
    try:
        return asyncio.run(
            collect(manager, backend, ChatTokenizer(tokenizer), rollout, players=players)
        )
    finally:
        manager.close()


@pytest.mark.parametrize("mode", ["trajectory", "step"])
def test_the_env_runner_through_the_proxy_records_what_the_env_manager_records(
    mode: str, backend: HFBackend, tokenizer: Any
) -> None:
    own = play(backend, tokenizer, config(mode), None)
    proxied = play(backend, tokenizer, config(mode), ProxyPlayers(AgentSettings()))
    assert proxied.metrics["all/failed"] == 0
    assert proxied.metrics["proxy/prefix_breaks"] == 0
    for ours, theirs in zip(own.trajectories, proxied.trajectories, strict=True):
        assert (ours.group_id, ours.seed) == (theirs.group_id, theirs.seed)
        assert ours.termination_reason == theirs.termination_reason
        assert (ours.score, ours.success) == (theirs.score, theirs.success)
        pairs = list(zip(ours.samples(), theirs.samples(), strict=True))
        assert pairs  # trajectory mode: one sample an episode; step mode: one a turn
        for a, b in pairs:
            assert a.input_ids == b.input_ids
            assert a.loss_mask == b.loss_mask
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
            assert (a.token_rewards, a.score, a.state) == (b.token_rewards, b.score, b.state)
    pad = tokenizer.pad_token_id
    batches = [
        RolloutBatch.from_trajectories(r.trajectories, pad_token_id=pad) for r in (own, proxied)
    ]
    assert batches[0].input_ids.equal(batches[1].input_ids)
    assert batches[0].loss_mask.equal(batches[1].loss_mask)


class Replies:
    """A backend that answers with given texts in turn, as the engine would: the text's
    ids and the end-of-turn id, one log-probability each."""

    def __init__(self, tokenizer: Any, texts: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.texts = list(texts)
        self.prompts: list[list[int]] = []

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, **_: Any
    ) -> Generation:
        self.prompts.append(list(prompt_ids))
        text = self.texts[(len(self.prompts) - 1) % len(self.texts)]
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        ids = ids[: params.max_new_tokens]
        return Generation(
            ids, [-0.5] * len(ids), "stop" if len(ids) < params.max_new_tokens else "length"
        )

    async def update_weights(self, weights: Any) -> None:
        return None

    async def close(self) -> None:
        return None


async def serving(recorder: SessionRecorder) -> tuple[ProxyServer, Any]:
    server = ProxyServer()
    await server.start()
    return server, server.open(recorder)


def test_the_openai_client_works_unchanged(backend: HFBackend, tokenizer: Any) -> None:
    chat = ChatTokenizer(tokenizer)

    async def main() -> None:
        recorder = SessionRecorder(
            backend, chat, config(sampling=SamplingParams(max_new_tokens=8, seed=1))
        )
        server, session = await serving(recorder)
        client = openai.AsyncOpenAI(base_url=session.base_url, api_key=server.token, max_retries=0)
        try:
            models = await client.models.list()
            assert [m.id for m in models.data] == ["policy"]
            messages: list[Any] = [
                {"role": "system", "content": "Push the box."},
                {"role": "user", "content": "#_P#"},
            ]
            reply = await client.chat.completions.create(
                model="any", messages=messages, logprobs=True
            )
            turn = recorder.turns[0]
            assert reply.choices[0].message.content == chat.decode_response(turn.response_ids)
            assert reply.usage is not None and reply.usage.completion_tokens == len(
                turn.response_ids
            )
            assert reply.usage.prompt_tokens == len(turn.prompt_ids)
            assert (
                reply.choices[0].logprobs is not None
                and reply.choices[0].logprobs.content is not None
            )
            assert [t.logprob for t in reply.choices[0].logprobs.content] == turn.logprobs
            messages += [reply.choices[0].message, {"role": "user", "content": "#P_#"}]
            stream = await client.chat.completions.create(
                model="any", messages=messages, stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            assert text == chat.decode_response(recorder.turns[1].response_ids)
            assert not recorder.turns[1].starts_sample  # the SDK's own message object extends
            completion = await client.completions.create(model="any", prompt="#_P#")
            assert completion.choices[0].text == chat.decode_response(
                recorder.turns[2].response_ids
            )
            assert recorder.turns[2].prompt_ids == chat.encode("#_P#")
        finally:
            await client.close()
            await server.stop()

    asyncio.run(main())


def test_tool_calls_come_back_in_openai_shape_and_the_result_extends_the_sample(
    qwen_model_dir: Path,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen_model_dir)
    chat = ChatTokenizer(tokenizer)
    call = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    replies = Replies(tokenizer, [call, "<answer>3</answer>"])
    tool: Any = {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add",
            "parameters": {"type": "object", "properties": {}},
        },
    }

    async def main() -> None:
        recorder = SessionRecorder(
            replies, chat, config(sampling=SamplingParams(max_new_tokens=64))
        )
        server, session = await serving(recorder)
        client = openai.AsyncOpenAI(base_url=session.base_url, api_key=server.token, max_retries=0)
        try:
            messages: list[Any] = [{"role": "user", "content": "1 + 2?"}]
            first = await client.chat.completions.create(model="p", messages=messages, tools=[tool])
            choice = first.choices[0]
            assert choice.finish_reason == "tool_calls"
            calls = choice.message.tool_calls
            assert calls is not None and calls[0].function.name == "add"  # type: ignore[union-attr]
            assert json.loads(calls[0].function.arguments) == {"a": 1, "b": 2}  # type: ignore[union-attr]
            messages += [
                choice.message,
                {"role": "tool", "tool_call_id": calls[0].id, "content": "3"},
            ]
            await client.chat.completions.create(model="p", messages=messages, tools=[tool])
        finally:
            await client.close()
            await server.stop()
        assert '"name": "add"' in tokenizer.decode(
            recorder.turns[0].prompt_ids
        )  # tools reached the template
        second = recorder.turns[1]
        assert not second.starts_sample
        tool_message = {"role": "tool", "tool_call_id": calls[0].id, "content": "3"}
        assert second.prompt_ids == chat.next_segment(
            recorder.turns[0].response_ids, [tool_message], [tool]
        )
        assert (
            replies.prompts[1]
            == replies.prompts[0] + recorder.turns[0].response_ids + second.prompt_ids
        )

    asyncio.run(main())


def test_bad_requests_get_openai_errors_and_the_server_goes_on(tokenizer: Any) -> None:
    chat = ChatTokenizer(tokenizer)

    async def main() -> None:
        recorder = SessionRecorder(Replies(tokenizer, ["Up"]), chat, config(sequence_length=64))
        server, session = await serving(recorder)
        url = f"{session.base_url}/chat/completions"
        good = {"model": "p", "messages": [{"role": "user", "content": "#P#"}]}
        auth = {"Authorization": f"Bearer {server.token}"}
        async with httpx.AsyncClient() as client:

            async def post(
                body: Any, headers: Any = auth, at: str = url, raw: bool = False
            ) -> httpx.Response:
                if raw:
                    return await client.post(at, content=body, headers=headers)
                return await client.post(at, json=body, headers=headers)

            cases = {
                "malformed json": (await post(b"{not json", raw=True), 400),
                "no token": (await post(good, headers={}), 401),
                "wrong token": (await post(good, headers={"Authorization": "Bearer nope"}), 401),
                "unknown session": (await post(good, at=url.replace(session.name, "nope")), 404),
                # sessions are opened by the run here, not by agents (mode=serve's route)
                "open a session": (await post({}, at=f"{server.url}/sessions"), 404),
                "bad role": (await post({"messages": [{"role": "robot", "content": "x"}]}), 400),
                "bad tool schema": (
                    await post({**good, "tools": [{"type": "function", "function": "add"}]}),
                    400,
                ),
                "n above 1": (await post({**good, "n": 2}), 400),
                "too long": (
                    await post({"messages": [{"role": "user", "content": "#P# " * 80}]}),
                    400,
                ),
            }
            for name, (response, status) in cases.items():
                assert response.status_code == status, (name, response.text)
                assert set(response.json()["error"]) == {"message", "type", "code"}, name
            assert cases["too long"][0].json()["error"]["code"] == "context_length_exceeded"
            recorder.ending = None  # the too-long request ended the episode; go on regardless
            assert (await post(good)).status_code == 200
            server.finish(session)
            late = await post(good)
            assert late.status_code == 410 and session.late_calls == 1
        await server.stop()

    asyncio.run(main())


def test_the_proxy_listens_on_loopback_and_asks_for_the_token_everywhere(tokenizer: Any) -> None:
    async def main() -> None:
        recorder = SessionRecorder(Replies(tokenizer, ["Up"]), ChatTokenizer(tokenizer), config())
        assert ProxyServer().host == "127.0.0.1"
        server = ProxyServer("0.0.0.0")
        await server.start()
        session = server.open(recorder)
        assert "0.0.0.0" not in session.base_url  # the machine's address, for other nodes
        async with httpx.AsyncClient() as client:
            answer = await client.get(f"http://127.0.0.1:{server.port}/s/{session.name}/v1/models")
        assert answer.status_code == 401
        await server.stop()

    asyncio.run(main())


class Misbehaving:
    """A runner that misbehaves one way per env (index): raises, hangs, never calls the
    model, calls after its feedback ended the episode; the fifth plays properly."""

    async def run(self, task: AgentTask, base_url: str, api_key: str) -> AgentResult | None:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        messages: Any = [{"role": "user", "content": "#P#"}]
        try:
            if task.env_index == 0:
                await client.chat.completions.create(model="p", messages=messages)
                raise RuntimeError("the agent broke")
            if task.env_index == 1:
                await asyncio.sleep(3600)
            if task.env_index == 2:
                return AgentResult(reward=1.0)
            if task.env_index == 3:
                await client.chat.completions.create(model="p", messages=messages)
                async with httpx.AsyncClient() as http:
                    feedback = base_url.removesuffix("/v1") + "/feedback"
                    await http.post(
                        feedback,
                        json={"reward": 1.0},
                        headers={"Authorization": f"Bearer {api_key}"},
                    )
                with pytest.raises(openai.APIStatusError, match="410"):
                    await client.chat.completions.create(model="p", messages=messages)
                return None
            return await EnvRunner().run(task, base_url, api_key)
        finally:
            await client.close()


def test_failing_agents_fail_their_episodes_only_and_the_batch_completes(tokenizer: Any) -> None:
    replies = Replies(tokenizer, ["Up"])
    players = ProxyPlayers(AgentSettings(timeout=2.0), runner=Misbehaving())
    manager = EnvManager(tags=["sokoban"], env_groups=5, group_size=1, seed=5)
    started = time.perf_counter()
    try:
        result = asyncio.run(
            collect(manager, replies, ChatTokenizer(tokenizer), config(), players=players)
        )
    finally:
        manager.close()
    assert time.perf_counter() - started < 30  # the hanging agent did not hold the batch
    reasons = [(t.env_index, t.termination_reason) for t in result.trajectories]
    assert reasons[:4] == [(i, "agent_error") for i in range(4)]
    assert reasons[4][1] != "agent_error"
    errors = [t.error or "" for t in result.trajectories[:4]]
    assert "the agent broke" in errors[0]
    assert "agent.timeout=2.0" in errors[1]
    assert "without calling the model" in errors[2]
    assert "after its episode ended" in errors[3]
    assert result.metrics["all/failed"] == 4


class Summarising:
    """An agent that rewrites its history after the first turn (a new sample), posts its
    reward as feedback, and returns nothing: Trinity's serve-mode agents do this."""

    def run(self, task: AgentTask, base_url: str, api_key: str) -> None:
        client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        system: Any = {"role": "system", "content": "Push the box."}
        first = client.chat.completions.create(
            model="p", messages=[system, {"role": "user", "content": "#P_#"}]
        )
        history = [system, {"role": "user", "content": "#P_#"}, first.choices[0].message]
        client.chat.completions.create(
            model="p", messages=[*history, {"role": "user", "content": "#_P#"}]
        )
        summary: Any = {"role": "user", "content": "so far: moved once. #_P#"}
        client.chat.completions.create(model="p", messages=[system, summary])
        client.close()
        httpx.post(
            base_url.removesuffix("/v1") + "/feedback",
            json={"reward": 0.75, "success": True},
            headers={"Authorization": f"Bearer {api_key}"},
        )


def test_a_rewritten_history_starts_a_new_sample_and_feedback_sets_the_reward(
    tokenizer: Any,
) -> None:
    replies = Replies(tokenizer, ["Up"])
    players = ProxyPlayers(AgentSettings(), runner=Summarising())
    result = play(replies, tokenizer, config(), players, groups=1)
    assert result.metrics["proxy/prefix_breaks"] == 2  # one per episode
    assert result.metrics["proxy/requests"] == 3
    for trajectory in result.trajectories:
        assert [turn.starts_sample for turn in trajectory.turns] == [False, False, True]
        samples = trajectory.samples()
        assert len(samples) == 2
        assert [s.score for s in samples] == [0.75, 0.75] and trajectory.success
        summary = [
            {"role": "system", "content": "Push the box."},
            {"role": "user", "content": "so far: moved once. #_P#"},
        ]
        rewritten = ChatTokenizer(tokenizer).first_segment(summary)
        assert samples[1].input_ids == rewritten + trajectory.turns[2].response_ids
        assert sum(samples[0].loss_mask) == len(trajectory.turns[0].response_ids) * 2


def test_the_docs_agent_is_the_shipped_one() -> None:
    root = Path(__file__).parents[2]
    page = (root / "docs" / "agents.md").read_text()
    shown = page.split("```python\n", 1)[1].split("```", 1)[0]
    source = (root / "agentgym" / "proxy" / "example_agent.py").read_text()

    def code(text: str) -> list[str]:
        text = re.sub(r'^""".*?"""\n', "", text, flags=re.DOTALL | re.MULTILINE)
        text = re.sub(r'^\s+""".*?"""\n', "", text, flags=re.MULTILINE)
        text = re.sub(r"\s+# type: ignore\[[a-z-]+\]", "", text)
        return [line for line in text.splitlines() if line.strip() and "__future__" not in line]

    assert code(shown) == code(source)


@pytest.mark.parametrize("runner", ["env", "tool_call"])
def test_a_tool_env_through_the_proxy_records_what_the_env_manager_records(
    runner: str, qwen_model_dir: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(qwen_model_dir)
    rollout = config(sampling=SamplingParams(max_new_tokens=64))
    players = ProxyPlayers(AgentSettings(runner=runner))
    results = []
    with registered("add_tool_proxy", AddToolEnv):
        for who in (None, players):
            manager = EnvManager(tags=["add_tool_proxy"], env_groups=3, group_size=1, seed=2)
            chat = ChatTokenizer(tokenizer)
            results.append(
                asyncio.run(
                    collect(manager, ScriptedBackend(tokenizer), chat, rollout, players=who)
                )
            )
            manager.close()
    own, proxied = results
    assert proxied.metrics["proxy/prefix_breaks"] == 0
    for ours, theirs in zip(own.trajectories, proxied.trajectories, strict=True):
        assert ours.success and theirs.success, theirs.error
        assert [turn.response_ids for turn in ours.turns] == [
            turn.response_ids for turn in theirs.turns
        ]
        assert [s.input_ids for s in ours.samples()] == [s.input_ids for s in theirs.samples()]
        assert [s.loss_mask for s in ours.samples()] == [s.loss_mask for s in theirs.samples()]
    if runner == "tool_call":  # the agent saw OpenAI tool calls and answered with tool messages
        roles = [m["role"] for m in proxied.trajectories[0].messages]
        assert roles == ["system", "user", "assistant", "tool", "assistant"]
        assert proxied.trajectories[0].messages[2]["tool_calls"][0]["function"]["name"] == "add"


def test_an_agent_of_the_openai_agents_sdk_trains_two_steps(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    output = tmp_path / "run"
    runner = "agent.runner=tests.proxy.agents_sdk_agent:SokobanAgentsSDK"
    result = train_two_steps(
        # a random model's episodes all score alike: keep their groups, scores as they are
        [
            "agent=proxy",
            runner,
            f"pretrain={tiny_model_dir}",
            "generation=hf",
            "reward_normalization.method=identity",
            "drop_zero_variance_groups=false",
        ],
        output=output,
        model_cache=tmp_path / "models",
        pythonpath=Path(__file__).parents[2],
    )
    steps = logged_steps(output)
    assert [steps[s]["train/all/failed"] for s in (1, 2)] == [0.0, 0.0], result.stderr[-3000:]
    assert all(steps[s]["train/proxy/requests"] >= 1 for s in (1, 2))
    assert "actor/loss" in steps[2]


def test_ahead_of_training_through_the_proxy_records_each_turns_version(
    tiny_tokenizer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from agentgym.rollout.source import AheadSource, Rollout
    from tests.rollout.test_async_rollout import CONFIG, SlowScripted, manager
    from tests.rollout.test_source import play

    envs = manager()
    rollout = Rollout(
        envs,
        SlowScripted(tiny_tokenizer),
        ChatTokenizer(tiny_tokenizer),
        CONFIG,
        ProxyPlayers(AgentSettings()),
    )
    batches, _, state = play(AheadSource(rollout, ratio=1), steps=3)
    envs.close()
    assert [len(b.trajectories) for b in batches] == [4, 4, 4]
    for step, batch in enumerate(batches, start=1):
        assert batch.metrics["train/proxy/requests"] >= 1
        for trajectory in batch.trajectories:
            versions = [turn.policy_version for turn in trajectory.turns]
            assert versions == sorted(versions)  # each request's own version, never older
            assert all(0 <= step - 1 - v <= 1 for v in versions)
    assert state["cursor"] == 6
    assert "Exception in ASGI application" not in caplog.text  # closing cancels cleanly


def test_an_idle_connection_stays_open_across_a_training_step(tokenizer: Any) -> None:
    """A connection idle longer than uvicorn's default keep-alive (5 s, less than a step)
    is still the server's when the agent's pool reuses it: no request meets a close."""

    async def main() -> None:
        recorder = SessionRecorder(Replies(tokenizer, ["Up"]), ChatTokenizer(tokenizer), config())
        server, session = await serving(recorder)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        body = json.dumps({"messages": [{"role": "user", "content": "#P#"}]}).encode()
        request = (
            f"POST /s/{session.name}/v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {server.token}\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode() + body
        for attempt in range(2):
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200")
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )  # fmt: skip
            await reader.readexactly(length)
            if attempt == 0:
                await asyncio.sleep(5.5)  # idle past uvicorn's default keep-alive
                assert not reader.at_eof()
        writer.close()
        await server.stop()

    asyncio.run(main())
