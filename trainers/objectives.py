"""The recipe's per-micro-batch losses: the policy's (``pg_variant``'s loss, PPO-clip by
default, with KL, SFT, TOPR and entropy terms, as ROLL's actor mixes them) and the
critic's (GAE's value loss).

Each is called by a strategy once per micro-batch and returns that micro-batch's
*share* of the mini-batch loss (normalized by the mini-batch's token and sequence
counts, given at construction), so gradient accumulation is exact; the math is in
:mod:`~agentgym.trainers.losses`, :mod:`~agentgym.trainers.loss_terms` and
:mod:`~agentgym.trainers.gae`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from agentgym.choices import PG_VARIANT_KNOBS
from agentgym.trainers.gae import value_loss
from agentgym.trainers.loss_terms import mix_losses, sft_loss
from agentgym.trainers.losses import POLICY_LOSS_REDUCE, Aggregation, kl_penalty
from agentgym.trainers.pg_variants import PG_VARIANTS
from agentgym.trainers.strategies import LossInputs, Metric, ModelOutputs
from agentgym.trajectory import RolloutBatch

if TYPE_CHECKING:
    from agentgym.trainers.recipe_config import LossConfig


class PolicyLoss:
    """The per-micro-batch GRPO loss: ``pg_variant``'s policy loss, plus KL, SFT and
    entropy terms when configured.

    As ROLL's actor adds them (:func:`~agentgym.trainers.loss_terms.mix_losses`)::

        rl_loss_coef * (pg + kl_loss_coef * kl) + sft_loss_coef * sft - entropy_loss_coef * entropy

    where ``pg`` is ``PG_VARIANTS[pg_variant]`` (:mod:`~agentgym.trainers.pg_variants`;
    ``ppo``, PPO-clip, by default) called with the knobs ``PG_VARIANT_KNOBS`` names and
    each sample's ``batch.scores`` (TOPR splits by them), weighing each sample by
    ``batch.sample_weights`` when set (``length_loss_weight``,
    ``difficulty_loss_weight``), and ``sft`` is
    :func:`~agentgym.trainers.loss_terms.sft_loss` (TOPR's with ``use_topr_loss``).

    ``num_tokens``/``num_seqs`` are the mini-batch's counts, so each micro-batch's
    loss and metrics are its share of the mini-batch's (exact accumulation).
    """

    def __init__(self, config: LossConfig, *, num_tokens: torch.Tensor, num_seqs: torch.Tensor):
        self.config = config
        self.counts = {
            "norm_length": config.loss_scale_factor,
            "num_tokens": num_tokens,
            "num_seqs": num_seqs,
        }
        self.aggregate = Aggregation(config.loss_agg_mode, **self.counts)  # type: ignore[arg-type]
        self.variant = PG_VARIANTS[config.pg_variant]
        self.knobs = {key: getattr(config, key) for key in PG_VARIANT_KNOBS[config.pg_variant]}
        self.needs = LossInputs(
            entropy=config.entropy_loss_coef != 0,
            logits=config.use_kl_loss and config.kl_penalty == "full",
            ref_logits=config.use_kl_loss and config.kl_penalty == "full",
        )

    def __call__(
        self, outputs: ModelOutputs, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, Metric]]:
        """The micro-batch's loss share and metrics."""
        config = self.config
        if batch.old_logprobs is None or batch.advantages is None:
            raise ValueError("the batch needs old_logprobs and advantages (prepare_batch)")
        mask = batch.loss_mask.float()  # [b, t]
        loss, raw = self.variant(
            outputs.logprobs,
            batch.old_logprobs,
            batch.advantages,
            mask,
            **self.knobs,
            scores=batch.scores,
            loss_agg_mode=config.loss_agg_mode,
            is_weights=batch.is_weights,
            sample_weights=batch.sample_weights,
            **self.counts,
        )
        empty = not bool(mask.any())
        metrics = {
            key: Metric(float(value), POLICY_LOSS_REDUCE.get(key, "sum"))  # type: ignore[arg-type]
            for key, value in raw.items()
            if not (empty and key in POLICY_LOSS_REDUCE)  # no ratio in an empty micro-batch
        }
        if config.use_kl_loss:
            if batch.ref_logprobs is None:
                raise ValueError("use_kl_loss needs the batch's ref_logprobs (prepare_batch)")
            kl = kl_penalty(
                outputs.logprobs,
                batch.ref_logprobs,
                config.kl_penalty,
                logits=outputs.logits,
                ref_logits=outputs.ref_logits,
            )
            kl_loss = self.aggregate(kl, mask)
            loss = loss + config.kl_loss_coef * kl_loss
            metrics["kl"] = Metric(float(kl_loss.detach()), "sum")
        sft = None
        if config.sft_loss_coef:
            per_token = sft_loss(
                outputs.logprobs,
                batch.old_logprobs,
                batch.advantages,
                batch.scores,
                mask,
                use_topr_loss=config.use_topr_loss,
            )  # [b, t]
            sft = self.aggregate(per_token, mask)
            metrics["sft_loss"] = Metric(float(sft.detach()), "sum")
        loss = mix_losses(
            loss, sft, rl_loss_coef=config.rl_loss_coef, sft_loss_coef=config.sft_loss_coef
        )
        if config.entropy_loss_coef:
            if outputs.entropy is None:
                raise ValueError("entropy_loss_coef needs the strategy's entropy output")
            entropy = self.aggregate(outputs.entropy, mask)
            loss = loss - config.entropy_loss_coef * entropy
            metrics["entropy"] = Metric(float(entropy.detach()), "sum")
        metrics["loss"] = Metric(float(loss.detach()), "sum")
        return loss, metrics


class ValueLoss:
    """The critic's per-micro-batch loss: :func:`~agentgym.trainers.gae.value_loss`
    (clipped by ``value_clip``), aggregated as ROLL's critic (``seq-mean-token-mean``).

    ``num_tokens``/``num_seqs`` are the mini-batch's counts (exact accumulation).
    """

    LOSS_AGG_MODE = "seq-mean-token-mean"

    def __init__(self, config: LossConfig, *, num_tokens: torch.Tensor, num_seqs: torch.Tensor):
        self.value_clip = config.value_clip
        self.num_tokens = num_tokens
        self.num_seqs = num_seqs

    def __call__(
        self, values: torch.Tensor, batch: RolloutBatch
    ) -> tuple[torch.Tensor, dict[str, Metric]]:
        """The micro-batch's loss share and metrics (token-mean shares that add up)."""
        if batch.values is None or batch.returns is None:
            raise ValueError("the critic's batch needs values and returns (prepare_batch)")
        loss, raw = value_loss(
            values,
            batch.values,
            batch.returns,
            (batch.loss_mask if batch.value_mask is None else batch.value_mask).float(),
            value_clip=self.value_clip,
            loss_agg_mode=self.LOSS_AGG_MODE,
            num_tokens=self.num_tokens,
            num_seqs=self.num_seqs,
        )
        return loss, {key: Metric(float(value), "sum") for key, value in raw.items()}
