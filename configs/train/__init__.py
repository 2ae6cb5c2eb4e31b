"""Config groups only the training config (config.yaml) reads: agent/ (who plays the
episodes). They sit apart so that ``agentgym.eval``'s own ``agent=`` key (solver,
random, model) is not taken for a group."""
