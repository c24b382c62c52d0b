"""Presets of the JSB Chorales optimisation study (``experiments/jsb.py``).

The study is Zilly et al. (2017), sec. 5.1 and Fig. 4: next-step prediction on JSB
Chorales with RHN, DT-RNN and DT(S)-RNN at recurrence depths 1, 2, 4 and 6, the
architectures of a depth holding the same number of parameters, each trained with
random hyperparameter settings; Fig. 4 plots every trial's test NLL. Those are the
defaults of :class:`~rhnzoo.tasks.polyphonic.JSBConfig` (the full study). The paper
gives neither the sizes nor the search budget: the full study's width 64, 20 trials of
40 epochs and batch 16, and the search space (``polyphonic.SEARCH_SPACE``) are ours.
"""

from __future__ import annotations

from typing import Any

from rhnzoo.config import preset_settings
from rhnzoo.tasks.polyphonic import JSBConfig

# name -> the settings it changes (flags given explicitly still win).
PRESETS: dict[str, dict[str, Any]] = {
    # 2-core CPU, about 9 minutes (docs/rhn.md): small widths, few trials and epochs.
    "cpu": {"width": 32, "trials": 10, "epochs": 25, "batch_size": 16},
}


def get_config(preset: str | None = None, **overrides: Any) -> JSBConfig:
    """The study's settings: the full study (:class:`JSBConfig`'s defaults), then preset
    ``preset`` (None: none; :data:`PRESETS`; recorded in the config), then ``overrides``
    (e.g. the flags given; lists become tuples).

    Raises:
      ValueError: an unknown preset (one line naming the known ones), an unknown or bad
        setting (one line).
    """
    settings = {**preset_settings(PRESETS, preset), **overrides, "preset": preset}
    return JSBConfig.from_dict(settings)
