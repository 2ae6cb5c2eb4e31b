"""Run megatron-core on the CPU: the development and CI mode of the Megatron strategy.

megatron-core 0.16 is written for CUDA: it calls ``torch.cuda.current_device()``,
reads and writes the CUDA RNG state, creates tensors with a literal
``device="cuda"`` or ``.cuda()``, and checks ``param.type() ==
"torch.cuda.FloatTensor"``. :func:`cpu_mode` redirects exactly these, while it is
entered, so the same megatron-core code runs on the CPU over gloo:

* ``torch.cuda.current_device`` returns 0, and every CUDA device argument
  (``"cuda"``, ``"cuda:0"``, ``0``) of a tensor factory or ``.to``/``.cuda`` call
  becomes the CPU (a :class:`torch.overrides.TorchFunctionMode`);
* the "CUDA" RNG state megatron-core forks for tensor-parallel initialization
  and dropout is the CPU generator's;
* ``Tensor.type()`` of a CPU float tensor reads as its CUDA name;
* activation recomputation's backward (which re-runs the forward) runs in the
  same mode.

Nothing is patched outside the ``with`` block, and the block nests. On a machine
with CUDA, :func:`cpu_mode` is not entered at all (see :func:`device_mode`).
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")
_lock = threading.Lock()
_depth = 0
_saved: list[tuple[Any, str, Any]] = []


def _is_cuda(device: Any) -> bool:
    if isinstance(device, int) and not isinstance(device, bool):
        return True
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class _CudaToCpu(TorchFunctionMode):
    """Rewrite CUDA device arguments to the CPU; ``.cuda()`` is a no-op."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if "cuda" not in name else name
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = _CPU
        if func is torch.Tensor.to:
            args = tuple(_CPU if _is_cuda(arg) else arg for arg in args)
        return func(*args, **kwargs)


def _cpu_rng_state(*_: Any, **__: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _set_cpu_rng_state(state: torch.Tensor, *_: Any, **__: Any) -> None:
    torch.set_rng_state(state)


def _in_cpu_mode(backward: Callable[..., Any]) -> Callable[..., Any]:
    """``backward`` of a recomputing autograd Function, run under :class:`_CudaToCpu`:
    the autograd engine does not carry the caller's torch-function mode into a
    Function's backward, where recomputation re-runs the layer's forward."""

    def run(ctx: Any, *grads: Any) -> Any:
        with _CudaToCpu():
            return backward(ctx, *grads)

    return run


def _patches() -> list[tuple[Any, str, Any]]:
    from megatron.core.tensor_parallel import random as mcore_random

    recompute = mcore_random.CheckpointFunction  # recompute_granularity: full | selective
    return [
        (recompute, "backward", staticmethod(_in_cpu_mode(recompute.backward))),
        (torch.cuda, "current_device", lambda: 0),
        (torch.cuda, "get_rng_state", _cpu_rng_state),
        (torch.cuda, "set_rng_state", _set_cpu_rng_state),
        (torch.cuda, "manual_seed", torch.manual_seed),
        (torch.cuda, "synchronize", lambda *_, **__: None),
        (mcore_random, "_get_cuda_rng_state", _cpu_rng_state),
        (mcore_random, "_set_cuda_rng_state", _set_cpu_rng_state),
    ]


@contextlib.contextmanager
def cpu_mode() -> Iterator[None]:
    """Redirect megatron-core's CUDA calls to the CPU inside the block (re-entrant)."""
    global _depth
    with _lock:
        if _depth == 0:
            for owner, name, replacement in _patches():
                _saved.append((owner, name, inspect.getattr_static(owner, name)))
                setattr(owner, name, replacement)
        _depth += 1
    try:
        with _CudaToCpu():
            yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                while _saved:
                    owner, name, original = _saved.pop()
                    setattr(owner, name, original)


def device_mode() -> contextlib.AbstractContextManager[None]:
    """:func:`cpu_mode` when CUDA is not available, else nothing."""
    return contextlib.nullcontext() if torch.cuda.is_available() else cpu_mode()
