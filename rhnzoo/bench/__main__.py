"""``python -m rhnzoo.bench``: the language-model train-step benchmark (:mod:`rhnzoo.bench.lm`)."""

from absl import app

from rhnzoo.bench import lm

if __name__ == "__main__":
    app.run(lm.main)
