"""The decoupled job (``mode: explore | train``, Trinity-RFT's explorer and trainer as
separate processes): where its processes meet, and what passes between them.

* :mod:`~agentgym.job.explorer`: the explorer's loop (``mode: explore``);
* :mod:`~agentgym.job.buffer_source`: the trainer's rollout source (``mode: train``);
* :mod:`~agentgym.job.buffer`: the experience buffer (SQLite: complete groups in slots,
  exactly-once leases), :mod:`~agentgym.job.ray_job` its Ray actor (``queue``) and the
  memory weight channel;
* :mod:`~agentgym.job.published_weights` (folders: sync by checkpoint) and
  :mod:`~agentgym.job.collective_weights` (``nccl``): the weight channels;
* :mod:`~agentgym.job.schedule`: when weights are published and loaded;
* :mod:`~agentgym.job.waiting`: the one wait loop every side uses.

What a job is built from lives on the build floor (:mod:`agentgym.builders.job`).
"""
