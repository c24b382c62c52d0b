"""The presets of each task, one module per task (as flax's ``configs/default.py``):
``get_config(preset) -> <the task's Config>``, every named setting in one place.

Above :mod:`rhnzoo.training` (whose configs they fill) and below :mod:`rhnzoo.apps`
(whose flags they set).
"""
