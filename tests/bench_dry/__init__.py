"""Every benchmark in ``benchmarks/`` runs in CI in a dry mode: tiny sizes, what is timed
checked for correctness, never the time (benchmarks/README.md, "Dry runs")."""
