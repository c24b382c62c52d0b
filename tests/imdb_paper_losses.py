r"""The first training losses of the Table 3 models at ``--preset=paper`` on the real IMDB.

  RHNZOO_DATA=../shared/data python tests/imdb_paper_losses.py --steps=250 \
      --divergence_factor=0 > tests/imdb_paper_losses.json

Not collected by pytest (no ``test_`` prefix). For each model: the run
``experiments/rrl.py --preset=paper --model=M`` makes (seed 0, Adadelta lr 1, 512 units,
up to 400 words, pre-trained word2vec), trained in memory for ``--steps`` steps
(:func:`rhnzoo.tasks.rrl.train_and_evaluate`), its validation and final evaluation on
the first batch of the dev split alone; prints JSON ``{"xent": {model: [loss of step 1,
...]}, "stopped": {model: the divergence message of the training steps or null},
"validation": {model: that of the validation at the end or null}, ...}`` (a paper run
validates first at its first epoch's end, step 665, not at step ``--steps``). With the
default ``--divergence_factor`` it is the divergence check's test on the real data
(about 10 minutes on 2 CPU cores at ``--steps=80``, at XLA's default optimisation level:
an experiment, not a test); with 0 it records the curves tests/test_engine.py replays
through the default check.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def main() -> None:
    from rhnzoo.config import RunSettings
    from rhnzoo.configs import rrl as presets
    from rhnzoo import engine
    from rhnzoo.tasks import rrl

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--models", default=",".join(presets.MODELS))
    parser.add_argument("--divergence_factor", type=float, default=RunSettings().divergence_factor)
    opts = parser.parse_args()
    c = presets.get_config("paper", "imdb")  # experiments/rrl.py --preset=paper's config
    data = rrl.load_data(c)
    first = data.dev.subset(range(c.batch_size))  # dev and test: one batch each
    data = dataclasses.replace(data, dev=first, test=first)
    out = {
        "steps": opts.steps,
        "divergence_factor": opts.divergence_factor,
        "seconds": {},
        "stopped": {},
        "validation": {},
        "xent": {},
    }
    for name in opts.models.split(","):
        config = c.replace(
            model=name,
            max_steps=opts.steps,
            log_every=1,
            progress=False,
            divergence_factor=opts.divergence_factor,
        )
        lines, start = [], time.time()
        out["stopped"][name] = out["validation"][name] = None
        try:
            rrl.train_and_evaluate(config, data, log=lines.append)
        except engine.TrainingDiverged as e:
            at_validation = str(e).startswith("validation loss")
            out["validation" if at_validation else "stopped"][name] = str(e)
        out["seconds"][name] = round(time.time() - start, 1)
        out["xent"][name] = [
            float(l.split("train xent ")[1].split()[0]) for l in lines if l.startswith("  step")
        ]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
