"""Analyses of trained models; computations apart from their matplotlib plots.

* :mod:`rhnzoo.analysis.lm`: RHN / HSG language models: gates, lesions, MC dropout.
* :mod:`rhnzoo.analysis.plots`: every figure (PNG, headless).

The names of both are re-exported here (``from rhnzoo import analysis``).
"""

from rhnzoo.analysis.lm import *  # noqa: F401,F403
from rhnzoo.analysis.lm import __all__ as _lm_all
from rhnzoo.analysis.plots import *  # noqa: F401,F403
from rhnzoo.analysis.plots import __all__ as _plots_all
from rhnzoo.training.engine import read_metrics

__all__ = [*_lm_all, *_plots_all, "read_metrics"]
