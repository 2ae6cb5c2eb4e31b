"""agentgym.rollout: env manager, multi-turn generation loop and generation backends."""

if __name__ != "agentgym.rollout":
    raise ImportError(
        f"The top-level folder 'rollout/' is part of agentgym and must be imported as "
        f"'agentgym.rollout', not as {__name__!r}. Install the project "
        f"(pip install -e .) and write 'import agentgym.rollout'."
    )
