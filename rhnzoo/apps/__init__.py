"""Applications: the flags, configs-from-flags and train-and-evaluate body of each paper,
above the library (``experiments/*.py`` are their command lines; nothing in the library
imports this package).

* :mod:`rhnzoo.apps.cli`: what every script shares: flags generated from a config's
  fields, the main wrapper (signals, one ``error: ...`` line).
* :mod:`rhnzoo.apps.lm`: the language models (``experiments/ptb.py``, ``experiments/char.py``).
* :mod:`rhnzoo.apps.depth_sweep`: the HSG depth sweep (``experiments/sweep.py``).
* :mod:`rhnzoo.apps.jsb`: the JSB Chorales optimisation study (``experiments/jsb.py``).
* :mod:`rhnzoo.apps.highway`: highway vs plain nets (``experiments/highway.py``).
* :mod:`rhnzoo.apps.rrl`: Recurrent Residual Learning (``experiments/rrl.py``).
* :mod:`rhnzoo.apps.analyze`: analyses of a trained run (``experiments/analyze.py``).
"""
