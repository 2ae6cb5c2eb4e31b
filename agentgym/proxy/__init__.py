"""The OpenAI-compatible proxy: any agent that speaks the OpenAI API plays the
episodes, and the proxy records the policy's tokens exactly (``agent.kind: proxy``).

* :mod:`~agentgym.proxy.server`: the HTTP server and its sessions;
* :mod:`~agentgym.proxy.recorder`: one session's recording, token for token;
* :mod:`~agentgym.proxy.runners`: who plays an episode (built-in and your own);
* :mod:`~agentgym.proxy.players`: the rollout's episode player for a runner.

Its server needs the ``[proxy]`` extra (FastAPI, uvicorn, openai); importing this
package does not.
"""
