r"""Text from a trained language model (a run of ptb.py or char.py).

  python experiments/generate.py --workdir=runs/ptb_small_d3_n256                 # sampled
  python experiments/generate.py --workdir=runs/ptb_small_d3_n256 --greedy --prompt="the"
  python experiments/generate.py --workdir=runs/ptb_char_small_d3_n256 --top_k=5 --temperature=0.8

Reads the run's best parameters (``best/``, else its latest checkpoint) and its data set's
vocabulary (``--data_dir``, default the run's; never downloaded), reads ``--prompt`` in one
window and draws ``--num_tokens`` tokens one step at a time with the training model's own
cell code (``rhnzoo.models.generate``): greedy (``--greedy``) or sampled with
``--temperature`` and ``--top_k`` from ``--seed`` (the same seed, the same text). Long
outputs show a progress bar (``--noprogress``: none). A workdir that is not a trained
language-model run is one ``error:`` line.
"""

from absl import flags

from rhnzoo.apps import cli
from rhnzoo.apps import generate

generate.define_flags()
flags.adopt_module_key_flags(generate)


def main(argv) -> None:
    del argv
    cli.main(generate.run)


if __name__ == "__main__":
    cli.run_app(main)
