"""The build floor: every function that turns a checked config into objects, for
every mode, and hands them over finished.

* :mod:`~agentgym.builders.train`: ``mode: both | train`` (:func:`build_train`: the
  recipe's settings and :class:`~agentgym.trainers.grpo.TrainParts`);
* :mod:`~agentgym.builders.explore`: ``mode: explore`` (:func:`build_explorer`);
* :mod:`~agentgym.builders.recipe`: the recipe's settings from the schema;
* :mod:`~agentgym.builders.model`: the model folder; :mod:`~agentgym.builders.cluster`:
  the cluster; :mod:`~agentgym.builders.strategies`: the policy and the critic;
* :mod:`~agentgym.builders.engines`: the generation backend (engines, router);
* :mod:`~agentgym.builders.rollouts`: env managers, :class:`~agentgym.rollout.source.Rollout`
  bundles and the rollout source;
* :mod:`~agentgym.builders.job`: a decoupled job's buffer, weight channel and the trainer's
  source;
* :mod:`~agentgym.builders.run_folder`: the run's saved config, ``meta.json`` and tracker.

What the config's keys imply (placements, data-parallel sizes, the sync schedule, the
job folder) are properties of the checked config (:class:`agentgym.schema.TrainConfig`),
derived in one place for the checks and the builders alike.
"""
