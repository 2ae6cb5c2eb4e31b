"""``sync_method: nccl``'s channel, run with gloo between real processes: the trainer's
serving thread here, explorers in spawned processes."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from agentgym.job.collective_weights import CollectiveChannel
from agentgym.job.published_weights import Published, WeightsGoneError

BUCKET = 600  # bytes: the weights below need several buckets


def weights(scale: float) -> dict[str, torch.Tensor]:
    embed = torch.arange(48, dtype=torch.float32).reshape(12, 4) * scale
    return {
        "embed.weight": embed,
        "layer.weight": torch.full((10, 10), scale),
        "layer.bias": torch.arange(10, dtype=torch.bfloat16),
        "lm_head.weight": embed,  # tied: sent once, arrives under both names
    }


def channel(job: Path) -> CollectiveChannel:
    return CollectiveChannel(job, backend="gloo", bucket_bytes=BUCKET, timeout=5, host="127.0.0.1")


def explorer(job: str, version: int | None, die_after: int | None, out: Any) -> None:
    """Read ``version`` (None: the newest) and send back what arrived, or the error;
    with ``die_after``, be killed after that many tensors."""
    side = channel(Path(job))
    latest = side.latest()
    assert latest is not None
    wanted = latest if version is None else Published(version, f"collective-v{version:08d}", 1)
    try:
        received = {}
        for count, (name, tensor) in enumerate(side.read(wanted), start=1):
            received[name] = (str(tensor.dtype), tensor.float().tolist())  # plain, for the queue
            if die_after is not None and count >= die_after:
                os.kill(os.getpid(), signal.SIGKILL)
        out.put(("ok", latest.version, received))
    except WeightsGoneError as error:
        out.put(("gone", latest.version, str(error)))


def run_explorer(job: Path, version: int | None = None, die_after: int | None = None) -> Any:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=explorer, args=(str(job), version, die_after, out))
    process.start()
    try:
        if die_after is not None:
            process.join(60)
            return process.exitcode
        return out.get(timeout=60)
    finally:
        process.join(10)
        if process.is_alive():
            process.kill()


def tensors(received: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {
        name: torch.tensor(values).to(getattr(torch, dtype.removeprefix("torch.")))
        for name, (dtype, values) in received.items()
    }


@pytest.fixture
def trainer(tmp_path: Path) -> Any:
    side = channel(tmp_path)
    yield side
    side.close()


def test_explorers_get_each_version_exactly_from_the_trainers_memory(
    trainer: CollectiveChannel, tmp_path: Path
) -> None:
    trainer.store(1, weights(1.0), groups_per_step=2)
    status, version, received = run_explorer(tmp_path)
    assert (status, version) == ("ok", 1)
    received = tensors(received)
    expected = weights(1.0)
    assert received.keys() == expected.keys()
    for name, tensor in expected.items():
        assert received[name].dtype == tensor.dtype
        assert torch.equal(received[name], tensor), name
    assert not (tmp_path / "weights" / "collective-v00000001").exists()  # nothing on disk
    [transfer] = trainer.transfers
    assert transfer["weights"] == "collective-v00000001"
    assert transfer["bytes"] == sum(  # the tied tensor once
        t.numel() * t.element_size() for n, t in expected.items() if n != "lm_head.weight"
    )

    trainer.store(2, weights(2.0), groups_per_step=2)
    status, version, received = run_explorer(tmp_path)
    assert (status, version) == ("ok", 2)
    assert torch.equal(tensors(received)["layer.weight"], torch.full((10, 10), 2.0))
    trainer.point(3, groups_per_step=2)  # a step that changed nothing: the same weights
    latest = trainer.latest()
    assert latest is not None and (latest.version, Path(latest.key).name) == (
        3,
        "collective-v00000002",
    )
    assert run_explorer(tmp_path)[:2] == ("ok", 3)


def test_a_replaced_version_is_gone_before_any_tensor_arrives(
    trainer: CollectiveChannel, tmp_path: Path
) -> None:
    trainer.store(1, weights(1.0), groups_per_step=2)
    trainer.store(2, weights(2.0), groups_per_step=2)
    status, _, message = run_explorer(tmp_path, version=1)
    assert status == "gone"
    assert "collective-v00000002" in message


def test_an_explorer_killed_mid_transfer_costs_the_server_that_transfer_only(
    trainer: CollectiveChannel, tmp_path: Path
) -> None:
    trainer.store(1, weights(1.0), groups_per_step=2)
    assert run_explorer(tmp_path, die_after=1) == -signal.SIGKILL
    status, version, received = run_explorer(tmp_path)  # a restarted explorer
    assert (status, version) == ("ok", 1)
    assert torch.equal(tensors(received)["embed.weight"], weights(1.0)["embed.weight"])
    assert [t["weights"] for t in trainer.transfers] == ["collective-v00000001"]


def test_no_server_yet_is_gone_not_a_crash(tmp_path: Path) -> None:
    side = channel(tmp_path)
    with pytest.raises(WeightsGoneError, match="no weight server"):
        next(side.read(Published(0, "collective-v00000000", 1)))


def test_the_last_version_outlives_the_trainer_on_disk(tmp_path: Path) -> None:
    trainer = channel(tmp_path)
    trainer.store(1, weights(1.0), groups_per_step=2)
    trainer.store(2, weights(2.0), groups_per_step=2)
    served = trainer.latest()
    trainer.close()  # the recipe closes its engine (the publisher) before it finishes
    trainer.finish(2)
    assert served is not None
    with pytest.raises(WeightsGoneError):  # a version only the server held is gone
        next(channel(tmp_path).read(served))
    status, version, received = run_explorer(tmp_path)
    assert (status, version) == ("ok", 2)
    expected = weights(2.0)
    got = tensors(received)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[name], tensor) for name, tensor in expected.items())
    assert channel(tmp_path).finished() == 2


def test_the_replaced_version_is_let_go_before_the_new_one_is_packed(
    trainer: CollectiveChannel, monkeypatch: pytest.MonkeyPatch
) -> None:
    import weakref

    from agentgym.job import collective_weights

    trainer.store(1, weights(1.0), 1)
    assert trainer._server is not None and trainer._server.snapshot is not None
    old = [weakref.ref(flat) for _, flat in trainer._server.snapshot.buckets]
    packing = collective_weights.copy_into
    alive_while_packing: list[int] = []

    def watched(*args: Any) -> None:  # the next version's buckets are being filled
        alive_while_packing.append(sum(ref() is not None for ref in old))
        packing(*args)

    monkeypatch.setattr(collective_weights, "copy_into", watched)
    trainer.store(2, weights(2.0), 1)
    # one packed copy on the device at a time: version 1's buffers were already gone
    assert alive_while_packing and set(alive_while_packing) == {0}
    latest = trainer.latest()
    assert latest is not None and latest.version == 2
