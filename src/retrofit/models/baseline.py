"""Deprecated: the stand-ins' module was ``retrofit.models.baseline`` (and their config ``BaselineConfig``) before
"baseline" came to mean only what a model is compared with; it is ``retrofit.models.standin`` (``StandinConfig``)
now. Kept for code that imports the old names (docs/standin.md showed ``from retrofit.models.baseline import
load_stats``); nothing in the package imports it."""

import warnings

from .standin import *  # noqa: F403
from .standin import StandinConfig

BaselineConfig = StandinConfig

warnings.warn(
    "retrofit.models.baseline is retrofit.models.standin now (BaselineConfig: StandinConfig)", DeprecationWarning, 2
)
