"""Models built from cells and layers; pure ``init`` / apply functions over params pytrees.

* :mod:`rhnzoo.models.lm`: recurrent language model (RHN, HSG-RHN; Zilly et al.,
  Shoham & Permuter).
* :mod:`rhnzoo.models.piano_roll`: next-frame piano-roll model (JSB Chorales).
* :mod:`rhnzoo.models.highway`: feed-forward highway and plain layer stacks and the
  fully connected ``FeedForwardNet`` (Srivastava et al. 2015).
* :mod:`rhnzoo.models.classifier`: sequence classifier (Wang & Tian 2016).
"""
