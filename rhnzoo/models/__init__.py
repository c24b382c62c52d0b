"""Models built from cells and layers; pure ``init`` / apply functions over params pytrees.

* :mod:`rhnzoo.models.lm`: recurrent language model (RHN, HSG-RHN; Zilly et al.,
  Shoham & Permuter).
* :mod:`rhnzoo.models.piano_roll`: next-frame piano-roll model (JSB Chorales).
* :mod:`rhnzoo.models.highway`: feed-forward highway and plain layer stacks and the
  fully connected ``FeedForwardNet`` (Srivastava et al. 2015).
* :mod:`rhnzoo.models.classifier`: sequence classifier (Wang & Tian 2016).
* :mod:`rhnzoo.models.generate`: step-wise inference and text generation with a
  language model (greedy, sampled: temperature, top-k).
* :mod:`rhnzoo.models.export`: a trained model's forward as a ``jax.export`` artifact
  that runs without rhnzoo.

:func:`num_params` counts the parameters of any of them (or of a params pytree).
"""

import math
from typing import Any


def num_params(model_or_params: Any) -> int:
    """Number of scalar parameters: of a model (anything with ``init(key)``; from shapes
    only, nothing is allocated) or of a parameter pytree."""
    import jax

    tree = model_or_params
    if hasattr(tree, "init") and callable(tree.init):
        tree = jax.eval_shape(tree.init, jax.random.PRNGKey(0))
    return int(sum(math.prod(getattr(a, "shape", ())) for a in jax.tree.leaves(tree)))
