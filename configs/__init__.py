"""agentgym.configs: the Hydra config tree, shipped as package data."""

if __name__ != "agentgym.configs":
    raise ImportError(
        f"The top-level folder 'configs/' is part of agentgym and must be imported as "
        f"'agentgym.configs', not as {__name__!r}. Install the project "
        f"(pip install -e .) and write 'import agentgym.configs'."
    )
