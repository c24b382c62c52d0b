r"""The first training losses of the Table 3 models at ``--preset=paper`` on the real IMDB.

  RHNZOO_DATA=../shared/data python tests/imdb_paper_losses.py --steps=250 \
      --divergence_factor=0 > tests/imdb_paper_losses.json

Not collected by pytest (no ``test_`` prefix). For each model: the run
``experiments/rrl.py --preset=paper --model=M`` makes (its task, seed 0, Adadelta lr 1,
512 units, up to 400 words, pre-trained word2vec), trained in memory for ``--steps``
steps without validation or final evaluation; prints JSON ``{"xent": {model: [loss of
step 1, ...]}, "stopped": {model: the divergence message or null}, ...}``. With the
default ``--divergence_factor`` it is the divergence check's test on the real data
(tests/test_rrl.py); with 0 it records the curves tests/test_engine.py replays.
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
    from rhnzoo.configs import rrl as presets
    from rhnzoo.training import engine, rrl

    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=250)
    parser.add_argument("--models", default=",".join(rrl.MODELS))
    parser.add_argument("--divergence_factor", type=float,
                        default=engine.RunConfig(epochs=1).divergence_factor)  # fmt: skip
    opts = parser.parse_args()
    c = presets.get_config("paper", "imdb")  # experiments/rrl.py --preset=paper's config
    data = rrl.load_data(c)
    vectors = rrl.embeddings_for(c, data, log=lambda line: None)
    out = {"steps": opts.steps, "divergence_factor": opts.divergence_factor, "seconds": {},
           "stopped": {}, "xent": {}}  # fmt: skip
    for name in opts.models.split(","):
        config = c.replace(model=name)
        model = config.classifier(data.num_classes, vocab_size=len(data.vocab))
        task = rrl.make_task(model, data.train, data.dev, data.test, config, 0, vectors)
        task = dataclasses.replace(task, validate=lambda params, track: {"dev_acc": 0.0},
                                   final_evaluate=lambda params, track: {})  # fmt: skip
        run = engine.RunConfig(epochs=c.epochs, max_steps=opts.steps, log_every=1,
                               progress=False, divergence_factor=opts.divergence_factor)  # fmt: skip
        lines, start = [], time.time()
        try:
            engine.run(task, run, None, log=lines.append)
            out["stopped"][name] = None
        except engine.TrainingDiverged as e:
            out["stopped"][name] = str(e)
        out["seconds"][name] = round(time.time() - start, 1)
        out["xent"][name] = [float(l.split("train xent ")[1].split()[0])
                             for l in lines if l.startswith("  step")]  # fmt: skip
    print(json.dumps(out))


if __name__ == "__main__":
    main()
