r"""Character-level language models with a Recurrent Highway Network (bits per character).

  python experiments/char.py --dataset=enwik8                      # Zilly et al. Table 3
  python experiments/char.py --dataset=text8                       # Zilly et al. Table 3
  python experiments/char.py --dataset=ptb_char --preset=small     # 2-core CPU, 15-25 min

Defaults are the reference code's ``enwik8_sota`` configuration (``text8_sota``
is identical; jzilly/RecurrentHighwayNetworks ``rhn_train.py``, test BPC 1.27).
The data are downloaded on first use (enwik8.zip 36 MB, text8.zip 31 MB, PTB from
``simple-examples.tgz``); ``--noverify_data`` accepts files of your own in
``--data_dir``. Rerunning with the same ``--workdir`` resumes; results land in
``<workdir>/results.json``.
"""

from absl import flags

from rhnzoo.apps import cli, lm
from rhnzoo.configs import lm as lm_configs

# Presets: rhnzoo/configs/lm.py (enwik8_sota defaults; --preset=small for ptb_char on a CPU).
lm.define_flags("enwik8", choices=lm_configs.char_sets())
flags.adopt_module_key_flags(lm)


def main(argv):
    del argv
    cli.main(lm.run)


if __name__ == "__main__":
    cli.run_app(main)
