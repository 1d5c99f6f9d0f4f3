"""``retrofit study GRID.yaml``: which scheme for my model, at what budget?

A grid of cells (scheme x options x budget x method x seed) with the continued-training control, run on the
pipeline's stages (``retrofit.pipeline.stages``), each cell cached; then the cheapest-budget table, the seeds
table, the retrieval table and the ppl-vs-length plot (``retrofit.study.tables``). The committed study reports
(``benchmarks/study*``) are research, outside the package: ``research/study_rounds.py`` rebuilds them from their
caches with the grids of ``research/study.py``, on the same cache (``retrofit.study.cache``) and tables.

    from retrofit.study import Grid, run_study
    run_study(Grid.from_yaml("recipes/study-tiny.yaml"), out="runs/study-tiny")
"""

from .grid import Grid, cells
from .run import run_study

__all__ = ["Grid", "cells", "run_study"]
