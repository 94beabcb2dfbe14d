"""metarl's benchmark scripts, run from the repository's root as ``python -m benchmarks.NAME``
(``benchmarks/README.md`` lists them, their commands and their latest figures)."""
