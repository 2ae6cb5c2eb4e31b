"""The GPU suite: ``python -m benchmarks.gpu --minutes 8`` on a lent GPU machine.

One command measures, with random weights in published shapes (Qwen2.5-0.5B and
-1.5B, :data:`agentgym.plan.shapes.SHAPES`): the card's bf16 matmul peak; the
Megatron strategy's train step at TP=1 and at the layout ``agentgym plan`` picks
(tokens/s, MFU against the measured peak); the torch strategy's step on the same
batch; HF-engine generation at the rollout batch; weight sync trainer → engine
(pack, transfer, load); and ``async_generation_ratio`` 0 against 1 with the engine
and the trainer sharing the GPU and a long-tailed env. It prints one table and
writes it as JSON; each item has a time budget and an item that fails records its
error and the suite goes on. ``--dry-run`` runs every item on the CPU with tiny
shapes in seconds (``tests/test_gpu_suite.py``), so the suite does not rot.
"""

import os

# The CUDA caching allocator in expandable segments (before torch is imported): the
# steps' large, varying logits would otherwise leave gigabytes in fragments, which the
# planner's reserve (``--reserve-gib``, 4 GiB) does not count on. A value the caller
# set wins.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
