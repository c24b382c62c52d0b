r"""Export a trained run's model as a ``jax.export`` artifact that runs without rhnzoo.

  python experiments/export.py --workdir=runs/ptb_small_d3_n256 --out=runs/ptb_export
  python experiments/export.py --workdir=runs/rrl_imdb --platforms=cpu

Writes into ``--out`` (default ``<workdir>/export``): ``forward.jaxexport`` and
``step.jaxexport`` (a language model: the teacher-forced window and one token) or
``logits.jaxexport`` (a sequence classifier), ``params.npz`` (the run's best parameters,
flattened), ``manifest.json`` (inputs, outputs, platforms), ``vocab.json`` (a language
model whose data set is on disk) and ``exported.py``, a loader that imports only jax and
numpy. Lowered for ``--platforms`` (default cpu, cuda, tpu), else for the CPU alone (the
manifest and the printed line say why). A workdir without a checkpoint is one ``error:``
line.
"""

from absl import flags

from rhnzoo.apps import cli
from rhnzoo.apps import export

export.define_flags()
flags.adopt_module_key_flags(export)


def main(argv) -> None:
    del argv
    cli.main(export.run)


if __name__ == "__main__":
    cli.run_app(main)
