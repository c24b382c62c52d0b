"""Each task's config class beside its presets, one module per task (as flax's
``configs/default.py``): the class (a :class:`rhnzoo.config.Config`, a run's
``config.json``) and ``get_config(preset) -> <the task's Config>``, every named setting in
one place.

Below the engine and the tasks (which they configure; reading a run's config imports no
trainer) and the applications (whose flags they define); above the models they describe.
"""
