"""agentgym.trainers: GRPO recipe, advantages, losses and training strategies."""

if __name__ != "agentgym.trainers":
    raise ImportError(
        f"The top-level folder 'trainers/' is part of agentgym and must be imported as "
        f"'agentgym.trainers', not as {__name__!r}. Install the project "
        f"(pip install -e .) and write 'import agentgym.trainers'."
    )
