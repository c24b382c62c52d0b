r"""Optimisation study on JSB Chorales: RHN vs DT-RNN vs DT(S)-RNN (Zilly et al. 2017, Fig. 4).

  python experiments/jsb.py                          # full study (see FLAGS for its size)
  python experiments/jsb.py --preset=cpu             # 2-core CPU, about 9 minutes
  python experiments/jsb.py --archs=rhn,dtrnn --depths=1,4 --trials=10 --epochs=20

Zilly et al. (sec. 5.1): at recurrence depths 1, 2, 4 and 6 the architectures have the
same number of parameters (the target: the whole model on an RHN of ``--width``; the others
get the closest width), every (architecture, depth) gets the same random search over the
SGD hyperparameters (``rhnzoo.studies.jsb.SEARCH_SPACE``, one draw per trial index,
so the comparison is paired), and Fig. 4 plots every trial's test NLL at its
best-validation epoch. Any registered cell can join (``--archs=rhn,lstm,hsg_gru``).

The study is ``rhnzoo.studies.jsb.study``: each trial a run of the multi-run
runner in ``<workdir>/trials/<arch>_d<depth>_t<trial>`` (config.json + results.json;
trained in memory). Also in ``--workdir``: ``config.json`` (the study's settings),
``results.jsonl`` (one line per trial), ``jsb_swarm.png`` (Fig. 4 style), ``results.md``
(best/median test NLL per architecture and depth). Rerunning with the same workdir skips
the finished trials; more ``--trials`` (or ``--archs``, ``--depths``) extend the study,
while another value of a setting that shapes a trial's result (``--epochs``,
``--batch_size``, ``--width``, ``--seed``, ``--max_steps``, ``--max_epochs``,
``--patience``, ``--divergence_factor``, ``--matmul_precision``) is refused. The
engine's ``--log_every``, ``--progress``, ``--checkpoint_every_steps`` and
``--tensorboard`` are not offered: a trial trains silently and keeps nothing but its
results. ``--jobs=N`` trains N trials at a time, each in a child process (this command
with ``--sweep_run=<trial>``; it compiles its own step, so this pays off for trials
longer than a process start, about 10 s).
"""

from absl import flags

from rhnzoo.apps import cli, jsb, runner

jsb.define_flags()
flags.adopt_module_key_flags(jsb)
flags.adopt_module_key_flags(runner)


def main(argv) -> None:
    del argv
    cli.main(jsb.run_study)


if __name__ == "__main__":
    cli.run_app(main)
