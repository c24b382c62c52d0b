r"""Word-level Penn Treebank with a (Highway-State-Gated) Recurrent Highway Network.

  python experiments/ptb.py --depth=40 --hsg          # Shoham & Permuter, Table 1
  python experiments/ptb.py --nohsg --depth=10        # Zilly et al., 65.4 test ppl
  python experiments/ptb.py --preset=small            # 2-core CPU, about 30 minutes

Defaults are the reference code's ``ptb_sota`` configuration. Rerunning with the
same ``--workdir`` resumes; results land in ``<workdir>/results.json``.
"""

from absl import flags

from rhnzoo.apps import cli, lm

lm.define_flags("ptb")
flags.adopt_module_key_flags(lm)


def main(argv):
    del argv
    cli.main(lambda: lm.run("ptb"))


if __name__ == "__main__":
    cli.run_app(main)
