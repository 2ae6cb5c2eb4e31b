"""Other frameworks' config files read as agentgym configs.

Translating a file is pure (:mod:`~agentgym.formats.roll`: the same file gives
the same config on every machine); adapting the result to the machine it runs
on is a separate, named step (:mod:`~agentgym.formats.fit`) that lists every
change it makes and refuses them all with ``fit_to_machine=false``.
"""
