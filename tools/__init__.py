"""The project's own tools, beside the package and never installed with it (issue 70):
the harvest of borrowed GPU windows and CPU chunks (:mod:`tools.harvest`), the renderers
of the docs' tables from their records (:mod:`tools.render`, :mod:`tools.highway_400`) and
a kernel window's files into the verified record (:mod:`tools.kernel_record`), and the GPU
measurements (``tools/gpu/``: ``measure.sh``, one part a device call, and its probes, run
by path: ``bash tools/gpu/measure.sh PART``). They read and write the checkout
(``docs/runs/``), so they run from it: ``python -m tools.<name>`` at the repository root.
The top floor: a tool may import :mod:`rhnzoo`, the package never imports a tool
(``tests/test_layers.py``).
"""
