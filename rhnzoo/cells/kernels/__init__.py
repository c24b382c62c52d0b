"""Mosaic GPU kernels of the recurrences (Pallas), the ``pallas`` implementation of
:mod:`rhnzoo.cells.scan`.

* :mod:`~rhnzoo.cells.kernels.common`: what every kernel shares.
* :mod:`~rhnzoo.cells.kernels.gated`: persistent kernels (the time loop in one launch each
  way) for the LSTM, SC-LSTM and the reset-after GRU.
* :mod:`~rhnzoo.cells.kernels.chained`: persistent kernels for the RRN and Cho et al.'s
  GRU (a second product that waits on the first).
* :mod:`~rhnzoo.cells.kernels.rhn`: one fused GEMM-and-highway kernel per micro-layer for
  the coupled RHN and HSG(RHN).
"""
