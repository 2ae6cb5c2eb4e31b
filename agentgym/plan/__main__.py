"""``python -m agentgym.plan``: the same as ``agentgym plan``."""

from agentgym.plan.command import main

if __name__ == "__main__":
    main()
