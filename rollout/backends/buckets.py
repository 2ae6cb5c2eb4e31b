"""Weight buckets: a run of named tensors packed into one contiguous byte buffer.

A weight sync streams the trainer's ``(name, tensor)`` pairs into buckets of
about ``bucket_bytes`` each (:func:`pack_buckets`); every bucket goes to every
engine, which loads it in place (:meth:`WeightBucket.tensors` gives views into
the buffer, no copy). The buffer is a numpy ``uint8`` array because Ray moves
numpy arrays through its object store without pickling their bytes, and an
actor reads them in place.

A tensor that shares its storage with one sent earlier in the same sync (tied
embeddings: ``lm_head.weight`` is ``embed_tokens.weight``) is sent once; the
later name travels as an alias (:attr:`TensorSpec.alias_of`) without bytes.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

DEFAULT_BUCKET_BYTES = 256 << 20
"""Bytes per bucket unless told otherwise: large enough that per-call overhead
vanishes, small enough that a few buckets in flight stay cheap next to the model."""


@dataclass(frozen=True)
class TensorSpec:
    """Where one tensor lies in a bucket's buffer.

    Attributes:
        name: The parameter's Hugging Face name.
        dtype: The torch dtype's name (``float32``, ``bfloat16``).
        shape: The tensor's shape.
        offset: Byte offset of its data in the buffer (-1 for an alias).
        alias_of: For a tensor that shares storage with one sent earlier in the
            same sync: that tensor's name (no bytes of its own). None otherwise.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    alias_of: str | None = None

    @property
    def num_bytes(self) -> int:
        """Bytes of the tensor's data (0 for an alias)."""
        if self.alias_of is not None:
            return 0
        return _itemsize(self.dtype) * _numel(self.shape)


@dataclass(frozen=True)
class WeightBucket:
    """Named tensors packed back to back into one ``uint8`` buffer.

    Attributes:
        index: The bucket's position in its sync (0, 1, ...).
        specs: The tensors, in the order they were streamed.
        payload: The packed data, ``[num_bytes]`` ``uint8``.
    """

    index: int
    specs: tuple[TensorSpec, ...]
    payload: np.ndarray

    @property
    def num_bytes(self) -> int:
        """Bytes of the payload."""
        return int(self.payload.nbytes)

    @property
    def names(self) -> list[str]:
        """Every name in the bucket, aliases included."""
        return [spec.name for spec in self.specs]

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        """The tensors with data, as read-only views into the payload (copy before writing)."""
        with warnings.catch_warnings():  # a payload read from Ray's object store is read-only
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.from_numpy(self.payload)  # [num_bytes] uint8
        return spec_views(flat, self.specs)

    def aliases(self) -> list[tuple[str, str]]:
        """``(name, alias_of)`` for the names that share an earlier tensor's storage."""
        return [(spec.name, spec.alias_of) for spec in self.specs if spec.alias_of is not None]

    def to_wire(self) -> tuple[memoryview, list[list[Any]]]:
        """Plain types (bytes and lists) for transports that carry nothing else (vLLM's RPC)."""
        specs = [[s.name, s.dtype, list(s.shape), s.offset, s.alias_of] for s in self.specs]
        return self.payload.data, specs

    @classmethod
    def from_wire(
        cls, payload: bytes, specs: Sequence[Sequence[Any]], index: int = 0
    ) -> WeightBucket:
        """Rebuild a bucket from :meth:`to_wire`'s output."""
        buffer = np.frombuffer(payload, dtype=np.uint8)
        return cls(
            index,
            tuple(TensorSpec(n, d, tuple(int(x) for x in s), int(o), a) for n, d, s, o, a in specs),
            buffer,
        )


def pack_bucket(index: int, entries: Sequence[tuple[str, torch.Tensor | str]]) -> WeightBucket:
    """Copy ``entries`` into one buffer; an entry whose value is a name is an alias of it.

    Tensors may live on any device; their bytes are copied to host memory.
    """
    specs = bucket_specs(entries)
    payload = np.empty(buffer_bytes(specs), dtype=np.uint8)
    copy_into(torch.from_numpy(payload), specs, entries)
    return WeightBucket(index, specs, payload)


def unshared(weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """``weights`` as contiguous host tensors of which no two share memory, for
    safetensors (it refuses shared ones): a tied model's ``lm_head.weight`` is its
    embedding, and on the CPU ``.cpu()`` hands back the same tensor; a tensor whose
    storage an earlier one holds is copied."""
    seen: set[int] = set()
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        host = tensor.detach().cpu().contiguous()
        storage = host.untyped_storage().data_ptr()
        if storage in seen:
            host = host.clone()
        seen.add(storage)
        tensors[name] = host
    return tensors


def bucket_specs(entries: Sequence[tuple[str, torch.Tensor | str]]) -> tuple[TensorSpec, ...]:
    """Where each of ``entries`` lies in a packed buffer (an entry whose value is a name
    is an alias of it, with no bytes): back to back, each at an offset its element
    size divides (a ``float32`` after an odd count of ``bfloat16`` values moves up two
    bytes: a view of the buffer as ``float32`` needs it). The buffer's size is
    :func:`buffer_bytes`."""
    specs: list[TensorSpec] = []
    offset = 0
    for name, value in entries:
        if isinstance(value, str):
            specs.append(TensorSpec(name, "", (), -1, alias_of=value))
            continue
        offset += -offset % value.element_size()
        dtype = str(value.dtype).removeprefix("torch.")
        specs.append(TensorSpec(name, dtype, tuple(value.shape), offset))
        offset += specs[-1].num_bytes
    return tuple(specs)


def buffer_bytes(specs: Sequence[TensorSpec]) -> int:
    """The packed buffer's size for ``specs`` (:func:`bucket_specs`): the end of its
    last tensor."""
    return max((spec.offset + spec.num_bytes for spec in specs if spec.alias_of is None), default=0)


def copy_into(
    flat: torch.Tensor,
    specs: Sequence[TensorSpec],
    entries: Sequence[tuple[str, torch.Tensor | str]],
) -> None:
    """Copy the tensors of ``entries`` into ``flat`` (``[num_bytes]`` ``uint8``, on any
    device) where ``specs`` (:func:`bucket_specs` of them) place them."""
    for spec, (_, value) in zip(specs, entries, strict=True):
        if isinstance(value, torch.Tensor) and spec.num_bytes:
            source = value.detach().contiguous().reshape(-1).view(torch.uint8)
            flat[spec.offset : spec.offset + spec.num_bytes].copy_(source)


def spec_views(flat: torch.Tensor, specs: Sequence[TensorSpec]) -> list[tuple[str, torch.Tensor]]:
    """The tensors with data in ``flat`` (a packed buffer), as views by name."""
    return [
        (
            spec.name,
            flat[spec.offset : spec.offset + spec.num_bytes]
            .view(getattr(torch, spec.dtype))
            .view(spec.shape),
        )
        for spec in specs
        if spec.alias_of is None
    ]


def chunk_weights(
    weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor | str]]]:
    """Group a ``(name, tensor)`` stream into runs of at most ``bucket_bytes`` each.

    A run closes before the tensor that would overflow it; a tensor larger than
    ``bucket_bytes`` gets a run of its own. A tensor that shares storage with
    one already streamed (and still alive) becomes ``(name, earlier_name)``.

    Raises:
        ValueError: If ``bucket_bytes`` < 1.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    seen: dict[tuple[Any, ...], tuple[str, weakref.ref[torch.Tensor]]] = {}
    run: list[tuple[str, torch.Tensor | str]] = []
    size = 0
    for name, tensor in weights:
        key = _storage_key(tensor)
        earlier = seen.get(key)
        if earlier is not None and earlier[1]() is not None:
            # the earlier tensor is alive, so its storage is too: a true alias, not a reused address
            run.append((name, earlier[0]))
            continue
        seen[key] = (name, weakref.ref(tensor))
        nbytes = tensor.numel() * tensor.element_size()
        if run and size + nbytes > bucket_bytes:
            yield run
            run, size = [], 0
        run.append((name, tensor))
        size += nbytes
    if run:
        yield run


def _storage_key(tensor: torch.Tensor) -> tuple[Any, ...]:
    return (
        tensor.device,
        tensor.untyped_storage().data_ptr(),
        tensor.storage_offset(),
        tensor.dtype,
        tuple(tensor.shape),
        tuple(tensor.stride()),
    )


def _itemsize(dtype: str) -> int:
    return int(torch.empty((), dtype=getattr(torch, dtype)).element_size())


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count
