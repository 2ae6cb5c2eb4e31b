"""``strategy_name: sglang``: a clear error without a server, and an SGLang server at
``base_url`` driven through the OpenAI-compatible backend (a stand-in server here:
completions with token ids and logprobs, and ``/update_weights_from_disk``)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from agentgym.errors import ConfigError
from agentgym.rollout.backends import SamplingParams, make_backend
from agentgym.rollout.backends.openai import OpenAIBackend
from agentgym.schema import validate


def test_sglang_without_a_server_names_what_to_install_and_run() -> None:
    with pytest.raises(ConfigError) as error:
        validate({"actor_infer": {"strategy_args": {"strategy_name": "sglang"}}})
    message = str(error.value)
    assert "generation.base_url=http://127.0.0.1:30000" in message
    assert "python -m sglang.launch_server" in message
    if importlib.util.find_spec("sglang") is None:
        assert 'not installed on this machine (pip install "sglang[all]" installs it)' in message
    with pytest.raises(ValueError, match=r"sglang\.launch_server"):
        make_backend("sglang", "/some/model")


class StandInSGLang(BaseHTTPRequestHandler):
    """Answers /v1/completions with two tokens and /update_weights_from_disk, recording both."""

    requests: list[tuple[str, dict[str, Any]]] = []
    reloaded: dict[str, Any] = {}

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append((self.path, body))
        if self.path == "/v1/completions":
            answer: dict[str, Any] = {"choices": [{
                "token_ids": [7, 8], "finish_reason": "stop",
                "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.5, -1.25]},
            }]}  # fmt: skip
        else:
            folder = Path(body["model_path"])
            self.reloaded.update(
                files=sorted(p.name for p in folder.iterdir()),
                weights=load_file(str(folder / "model.safetensors")),
            )
            answer = {"success": True, "message": "ok"}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stand_in_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInSGLang)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    StandInSGLang.requests.clear()
    StandInSGLang.reloaded.clear()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_sglang_with_a_url_generates_and_reloads_weights_through_the_server(
    stand_in_server: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    backend = make_backend(
        "sglang", str(tiny_model_dir), base_url=stand_in_server, weight_sync_dir=str(tmp_path)
    )
    assert isinstance(backend, OpenAIBackend) and backend.server == "sglang"

    async def play() -> Any:
        generation = await backend.generate([1, 2, 3], SamplingParams(max_new_tokens=2))
        await backend.update_weights([("w", torch.ones(2))])
        await backend.close()
        return generation

    generation = asyncio.run(play())
    assert (generation.token_ids, generation.logprobs) == ([7, 8], [-0.5, -1.25])
    paths = [path for path, _ in StandInSGLang.requests]
    assert paths == ["/v1/completions", "/update_weights_from_disk"]
    assert StandInSGLang.requests[0][1]["prompt"] == [1, 2, 3]
    assert StandInSGLang.reloaded["files"] == ["config.json", "model.safetensors"]
    assert StandInSGLang.reloaded["weights"]["w"].tolist() == [1.0, 1.0]
    assert list(tmp_path.iterdir()) == []  # the reload folder is gone
