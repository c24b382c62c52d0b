"""Analyses of trained models; computations apart from their matplotlib plots.

* :mod:`rhnzoo.analysis.lm`: RHN / HSG language models: gates, lesions, MC dropout.
* :mod:`rhnzoo.analysis.highway`: feed-forward highway / plain nets: gate statistics,
  lesions, activation and gradient statistics, the depth sweep's table and figures.
* :mod:`rhnzoo.analysis.flow`: information flow through time and depth for any cell:
  temporal Jacobians, Gersgorin discs, spectra, gradient norms.
* :mod:`rhnzoo.analysis.plots`: every figure (PNG, headless).

The names of ``lm`` and ``plots`` are re-exported here (``from rhnzoo import analysis``);
``highway`` and ``flow`` are used as modules (``from rhnzoo.analysis import flow``).
"""

from rhnzoo.analysis.lm import *  # noqa: F401,F403
from rhnzoo.analysis.lm import __all__ as _lm_all
from rhnzoo.analysis.plots import *  # noqa: F401,F403
from rhnzoo.analysis.plots import __all__ as _plots_all
from rhnzoo.engine.workdir import read_metrics

__all__ = [*_lm_all, *_plots_all, "read_metrics"]
