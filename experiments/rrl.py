r"""Recurrent Residual Learning for sequence classification (Wang & Tian, EMNLP 2016).

  python experiments/rrl.py --dataset=imdb --model=sc_lstm_i --preset=cpu   # 2-core CPU
  python experiments/rrl.py --dataset=imdb --preset=paper --model=hrl       # Table 2 sizes
  python experiments/rrl.py --dataset=imdb --preset=cpu --table             # Table 3 layout
  python experiments/rrl.py --dataset=imdb --preset=cpu --study=rrn         # RRN recipe study

Embedding (Word2Vec trained on the training split by default) or the raw pixel
(P-MNIST) -> one recurrent layer (any cell of rhnzoo.cells) -> final state -> dropout ->
softmax; Adadelta with gradient clipping; 15 % of the training set is the dev set.
Each model trains in ``<root>/<model>`` (root: --workdir, default
runs/rrl_<dataset>_<preset>); rerunning resumes. ``--table`` trains the --models not
finished, then prints Table 3's layout; ``--study=rrn|skip`` runs a study of what the
paper leaves open (``rrl.STUDIES``) at a reduced budget in ``<root>/study_<name>``.
Several processes or hosts: the same command on each with ``--distributed`` (batch rows
sharded over every process's devices; process 0 prints and writes the files).
"""

from absl import flags

from rhnzoo.apps import cli, rrl, runner

rrl.define_flags()
flags.adopt_module_key_flags(rrl)
flags.adopt_module_key_flags(runner)


def main(argv):
    del argv
    cli.main(rrl.experiment)


if __name__ == "__main__":
    cli.run_app(main)
