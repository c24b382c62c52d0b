"""Each task's config class (a :class:`rhnzoo.config.Config`, a run's ``config.json``)
beside its presets, one module per task (as flax's ``configs/default.py``), with
``get_config(preset) -> <the task's Config>``. Below the tasks: reading a run's config
imports no trainer.
"""
