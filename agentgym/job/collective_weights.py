"""``synchronizer.sync_method: nccl``: the trainer sends each version it publishes
from its device straight to each explorer's, over a two-rank process group made for
that one transfer (Trinity-RFT's ``nccl``; gloo on CPU, which the tests use).

The trainer keeps the newest version packed in buckets on its device
(:class:`CollectiveChannel.store`) and serves it from a thread: an explorer that
wants a version asks the trainer's ``TCPStore`` (its address in
``<job>/weights/collective.json``), gets the layout of the buckets, and both sides
form a process group under that request's prefix and broadcast the buckets from the
trainer (rank 0) to the explorer (rank 1). Training goes on meanwhile.

Trinity-RFT sets up one group of the trainer's rank 0 and the engines of the one
explorer its config names (``explorer.name``) before syncing; its users report it
hangs when a side restarts. Here each transfer has its own group and a timeout:
explorers join, leave and restart freely, and an explorer that dies mid-transfer
costs the trainer's serving thread one timeout, never a training step.
Versions, the newest's name and the trainer's end are recorded as for
``checkpoint`` (``LATEST.json``; the weights go to disk only for the last version, at
the trainer's end, for explorers that load it after the trainer is gone), so the job
folder must be on a filesystem every process reaches.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from agentgym.fileio import write_json_atomic
from agentgym.job.published_weights import FolderChannel, Published, WeightsGoneError
from agentgym.rollout.backends.buckets import (
    DEFAULT_BUCKET_BYTES,
    TensorSpec,
    bucket_specs,
    buffer_bytes,
    chunk_weights,
    copy_into,
    spec_views,
)

ADDRESS = "collective.json"
"""The trainer's weight server address, in ``<job>/weights/``."""
TRANSFER_TIMEOUT = 300.0
"""Seconds either side waits for the other in one transfer before giving it up."""
CONNECT_TIMEOUT = 10.0
"""Seconds an explorer tries to reach the trainer's server (a restarted trainer serves
on another port: the explorer reads the address again on its next try)."""
REQUEST_GRACE = 30.0
"""Seconds the server waits for a request's details before skipping it (its explorer
died between taking a number and asking)."""
_REQUESTS = "requests"


COLLECTIVE_BACKEND = "AGENTGYM_COLLECTIVE_BACKEND"
"""Environment variable: ``gloo`` runs ``sync_method=nccl``'s channel over gloo, on the
CPU (tests, and a job tried out on a machine without GPUs); unset: NCCL."""


def collective_backend() -> str:
    """The process-group backend of ``sync_method=nccl``: NCCL, or what
    :data:`COLLECTIVE_BACKEND` names (``gloo``).

    Raises:
        ValueError: When the variable names another backend.
    """
    backend = os.environ.get(COLLECTIVE_BACKEND, "nccl")
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"{COLLECTIVE_BACKEND}={backend!r}: use nccl or gloo")
    return backend


@dataclass(frozen=True)
class _Snapshot:
    """One published version, packed: each bucket's layout and its bytes on the device."""

    name: str
    buckets: tuple[tuple[tuple[TensorSpec, ...], torch.Tensor], ...]

    @property
    def num_bytes(self) -> int:
        return sum(int(flat.numel()) for _, flat in self.buckets)


class CollectiveChannel:
    """Weights sent over a process group per transfer (see the module docstring).

    Args:
        job_dir: The job folder (``checkpoint_root_dir/project/name``).
        backend: ``nccl`` (GPUs: the tensors stay on their device) or ``gloo`` (CPU).
        bucket_bytes: Bytes per bucket, one broadcast each.
        timeout: Seconds either side waits for the other in one transfer.
        host: The address explorers reach the trainer at (default ``MASTER_ADDR``, else
            this host's address).
    """

    def __init__(
        self,
        job_dir: Path,
        *,
        backend: str = "nccl",
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        timeout: float = TRANSFER_TIMEOUT,
        host: str | None = None,
    ) -> None:
        if backend not in ("nccl", "gloo"):
            raise ValueError(f"backend must be nccl or gloo, got {backend!r}")
        self.folder = FolderChannel(job_dir)
        self.backend = backend
        self.bucket_bytes = bucket_bytes
        self.timeout = timeout
        self.host = host or os.environ.get("MASTER_ADDR") or _own_address()
        self._server: _Server | None = None
        self._snapshot: _Snapshot | None = None
        self._groups_per_step = 1

    on_device = True
    """The publisher hands this channel the trainer's tensors where they are (no copy
    to host memory first)."""

    # -- the trainer's side ---------------------------------------------------------

    def store(
        self, version: int, tensors: Mapping[str, torch.Tensor], groups_per_step: int
    ) -> None:
        """Pack ``tensors`` on their device as version ``version`` and serve it.

        The version it replaces is let go first (a transfer under way keeps its own
        reference): the device holds one packed copy of the model, not two.
        """
        self._snapshot = None
        if self._server is not None:
            self._server.snapshot = None
        buckets = []
        for entries in chunk_weights(tensors.items(), self.bucket_bytes):
            specs = bucket_specs(entries)
            device = next((v.device for _, v in entries if isinstance(v, torch.Tensor)), "cpu")
            flat = torch.empty(buffer_bytes(specs), dtype=torch.uint8, device=device)
            copy_into(flat, specs, entries)
            buckets.append((specs, flat))
        _finish_copies(flat for _, flat in buckets)  # not the serving thread's transfer
        snapshot = _Snapshot(f"collective-v{version:08d}", tuple(buckets))
        if self._server is None:
            self._server = _Server(self.folder.root, self.backend, self.host, self.timeout)
        self._server.snapshot = self._snapshot = snapshot
        self._groups_per_step = groups_per_step
        self.folder.record(version, snapshot.name, groups_per_step)

    def point(self, version: int, groups_per_step: int) -> None:
        """Publish ``version`` with the newest weights, unchanged."""
        current = self.latest()
        if current is None:
            raise RuntimeError(f"nothing published in {self.folder.root} yet")
        self._groups_per_step = groups_per_step
        self.folder.record(version, Path(current.key).name, groups_per_step)

    def finish(self, version: int) -> None:
        """The trainer published its last version: it is written to the job folder too
        (as ``checkpoint`` writes every version), so that explorers still load it once
        this process, and its server, are gone."""
        snapshot = self._snapshot  # kept after close(): the recipe closes its engine first
        if snapshot is not None:
            tensors: dict[str, torch.Tensor] = {}
            for specs, flat in snapshot.buckets:
                tensors |= {name: t.cpu() for name, t in spec_views(flat, specs)}
                tensors |= {s.name: tensors[s.alias_of].clone() for s in specs if s.alias_of}
            self.folder.store(version, tensors, self._groups_per_step)
        self.folder.finish(version)

    def close(self) -> None:
        """Stop serving (the trainer's end); the newest version is kept for
        :meth:`finish`."""
        if self._server is not None:
            self._server.close()
            self._server = None

    @property
    def transfers(self) -> list[dict[str, Any]]:
        """The trainer's transfers so far: explorer, version, bytes, seconds."""
        return [] if self._server is None else list(self._server.transfers)

    # -- an explorer's side -----------------------------------------------------------

    def latest(self) -> Published | None:
        """The newest published version (None: nothing published yet)."""
        return self.folder.latest()

    def finished(self) -> int | None:
        """The trainer's last version, once it has finished (None: still training)."""
        return self.folder.finished()

    def read(self, published: Published) -> Iterator[tuple[str, torch.Tensor]]:
        """The tensors of ``published``, bucket by bucket, on this process's device.

        Raises:
            WeightsGoneError: The trainer no longer holds that version (a newer one
                replaced it, or the trainer restarted), or its server does not answer
                (before any tensor is yielded), or the transfer broke off midway.
        """
        import torch.distributed as dist

        if not Path(published.key).name.startswith("collective-"):  # the last, on disk
            yield from self.folder.read(published)
            return
        path = self.folder.root / ADDRESS
        if not path.is_file():
            raise WeightsGoneError(f"no weight server address in {path} yet")
        address = json.loads(path.read_text())
        try:
            store = dist.TCPStore(
                address["host"],
                int(address["port"]),
                is_master=False,
                timeout=timedelta(seconds=CONNECT_TIMEOUT),
                wait_for_workers=False,
            )
            store.set_timeout(timedelta(seconds=self.timeout))
        except (RuntimeError, OSError) as error:
            raise WeightsGoneError(
                f"the trainer's weight server at {address['host']}:{address['port']} does not "
                f"answer ({error})"
            ) from error
        try:
            number = store.add(_REQUESTS, 1)
            asker = f"{socket.gethostname()}:{os.getpid()}"
            want = {"name": Path(published.key).name, "by": asker}
            store.set(f"r{number}/want", json.dumps(want))
            store.wait([f"r{number}/layout"], timedelta(seconds=self.timeout))
            layout = json.loads(store.get(f"r{number}/layout"))
        except RuntimeError as error:  # the trainer ended or died meanwhile
            raise WeightsGoneError(f"the trainer's weight server went away ({error})") from error
        if layout.get("gone"):
            raise WeightsGoneError(
                f"version {published.version}'s weights are no longer served (the trainer "
                f"holds {layout.get('holds')})"
            )
        nccl = self.backend == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if nccl else None
        buckets = [
            (tuple(TensorSpec(n, d, tuple(s), o, a) for n, d, s, o, a in specs), size)
            for specs, size in layout["buckets"]
        ]
        targets = {spec.alias_of for specs, _ in buckets for spec in specs if spec.alias_of}
        try:
            group = _group(self.backend, dist.PrefixStore(f"r{number}/", store), 1, self.timeout)
        except RuntimeError as error:  # the trainer went away between layout and transfer
            raise WeightsGoneError(
                f"the transfer of version {published.version} could not start: {error}"
            ) from error
        kept: dict[str, torch.Tensor] = {}
        try:
            for specs, size in buckets:
                flat = torch.empty(size, dtype=torch.uint8, device=device or "cpu")
                try:
                    _broadcast(group, flat)
                except RuntimeError as error:  # the trainer died or gave up on us
                    raise WeightsGoneError(
                        f"the transfer of version {published.version} broke off: {error}"
                    ) from error
                for name, tensor in spec_views(flat, specs):
                    if name in targets:
                        kept[name] = tensor
                    yield name, tensor
                for spec in specs:
                    if spec.alias_of is not None:
                        yield spec.name, kept[spec.alias_of]
        finally:
            _close(group)


class _Server:
    """The trainer's thread that answers explorers' requests, one at a time."""

    def __init__(self, root: Path, backend: str, host: str, timeout: float) -> None:
        import torch.distributed as dist

        self.backend, self.timeout = backend, timeout
        self.store = dist.TCPStore(
            host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout)
        )
        root.mkdir(parents=True, exist_ok=True)
        write_json_atomic(
            root / ADDRESS, {"host": host, "port": self.store.port, "pid": os.getpid()}
        )
        self.snapshot: _Snapshot | None = None
        self.transfers: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="agentgym-weights", daemon=True)
        self._thread.start()
        atexit.register(self.close)  # the store's own threads must not outlive the interpreter

    def close(self) -> None:
        """Stop serving and release the store (its listening thread with it)."""
        self._stop.set()
        self._thread.join(timeout=self.timeout + 5)
        self.snapshot = None
        self.store = None  # type: ignore[assignment]
        atexit.unregister(self.close)

    def _serve(self) -> None:
        served = 0
        waiting_since: float | None = None
        while not self._stop.is_set():
            if self.store.add(_REQUESTS, 0) <= served:
                self._stop.wait(0.02)
                continue
            number = served + 1
            if not self.store.check([f"r{number}/want"]):
                waiting_since = waiting_since or time.monotonic()
                if time.monotonic() - waiting_since < REQUEST_GRACE:
                    self._stop.wait(0.02)
                    continue
                served, waiting_since = number, None  # its explorer died before asking
                continue
            served, waiting_since = number, None
            try:
                self._answer(number)
            except Exception as error:  # that transfer is lost, the next one is served
                print(f"weight server: request {number} failed: {error}", file=sys.stderr)

    def _answer(self, number: int) -> None:
        import torch.distributed as dist

        want = json.loads(self.store.get(f"r{number}/want"))
        snapshot = self.snapshot  # a newer store() may replace it: this transfer keeps its own
        if snapshot is None or snapshot.name != want["name"]:
            holds = None if snapshot is None else snapshot.name
            self.store.set(f"r{number}/layout", json.dumps({"gone": True, "holds": holds}))
            return
        layout = [
            [
                [[s.name, s.dtype, list(s.shape), s.offset, s.alias_of] for s in specs],
                int(flat.numel()),
            ]
            for specs, flat in snapshot.buckets
        ]
        self.store.set(f"r{number}/layout", json.dumps({"buckets": layout}))
        started = time.perf_counter()
        store = dist.PrefixStore(f"r{number}/", self.store)
        with _side_stream(snapshot.buckets[0][1].device if snapshot.buckets else None):
            group = _group(self.backend, store, 0, self.timeout)
            try:
                for _, flat in snapshot.buckets:
                    _broadcast(group, flat)
                _finish_copies(flat for _, flat in snapshot.buckets)
            finally:
                _close(group)
        self.transfers.append(
            {
                "explorer": want["by"],
                "weights": snapshot.name,
                "bytes": snapshot.num_bytes,
                "seconds": time.perf_counter() - started,
            }
        )


def _side_stream(device: torch.device | None) -> contextlib.AbstractContextManager[Any]:
    """A CUDA stream of the serving thread's own on ``device`` (none on the CPU): NCCL's
    work waits on the stream that launched it, so transfers launched from training's
    default stream would queue behind training kernels, and training behind them."""
    if device is None or device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.stream(torch.cuda.Stream(device=device))


def _finish_copies(buffers: Iterable[torch.Tensor]) -> None:
    """Wait for the work queued on the devices of ``buffers`` (their current streams,
    not every stream of every device: a publish must not wait for a transfer the
    serving thread has under way)."""
    devices = {flat.device for flat in buffers if flat.device.type == "cuda"}
    for device in devices:
        torch.cuda.current_stream(device).synchronize()


def _group(backend: str, store: Any, rank: int, timeout: float) -> Any:
    """A two-rank process group over ``store`` (no global ``init_process_group``).

    NCCL's groups wait blocking (``TORCH_NCCL_BLOCKING_WAIT``, unless set): a peer that
    dies mid-transfer raises in the waiting thread after ``timeout``, as gloo's do, so
    one broken transfer costs that transfer, where NCCL's watchdog would end the process.
    The variable is set for the whole process (NCCL reads it as each group is made), so
    NCCL groups made after it here wait blocking too.
    """
    import torch.distributed as dist

    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=timeout))
    os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")  # read as the group is made
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timedelta(seconds=timeout)
    return dist.ProcessGroupNCCL(store, rank, 2, options)


def _broadcast(group: Any, flat: torch.Tensor) -> None:
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank, options.rootTensor = 0, 0
    group.broadcast([flat], options).wait()


def _close(group: Any) -> None:
    shutdown = getattr(group, "shutdown", None)
    if shutdown is not None:
        with contextlib.suppress(Exception):  # a group whose peer is gone may refuse
            shutdown()


def _own_address() -> str:
    """This host's address as other hosts see it: the one its default route leaves from
    (a UDP socket's connect sends nothing), else its name's, else loopback."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("10.255.255.255", 1))
        address = str(probe.getsockname()[0])
        if not address.startswith("0."):
            return address
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
