"""Models built from cells and layers; pure ``init`` / apply functions over params pytrees.

* :mod:`rhnzoo.models.lm`: recurrent language model (RHN, HSG-RHN; Zilly et al.,
  Shoham & Permuter).
* :mod:`rhnzoo.models.piano_roll`: next-frame piano-roll model (JSB Chorales).
* :mod:`rhnzoo.models.highway`: feed-forward highway and plain layer stacks
  (Srivastava et al. 2015).
"""
