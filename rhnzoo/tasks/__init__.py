"""The tasks: each builds its model, data, step and evaluation and hands them to the
run engine (:mod:`rhnzoo.engine`) in its one ``train_and_evaluate``.

* :mod:`rhnzoo.tasks.lm`: language modelling with truncated BPTT.
* :mod:`rhnzoo.tasks.polyphonic`: piano-roll models (JSB Chorales).
* :mod:`rhnzoo.tasks.highway`: feed-forward highway / plain nets (MNIST, CIFAR-100).
* :mod:`rhnzoo.tasks.rrl`: sequence classification (IMDB, P-MNIST, AG News, 20NG).
* :mod:`rhnzoo.tasks.classify`: batches and steps shared by the two classification
  tasks.

The studies (a paper's many runs and its tables) are above, in :mod:`rhnzoo.studies`;
the experiments' flags and bodies above them, in :mod:`rhnzoo.apps`.
"""
