"""Probe (issue 48, seventh session): the default LM continued by further chain stages on 2 CPU cores.

Each call trains one more chain stage of ``steps`` batches (the recipe's chain mix, lr and item stream:
``rag_lab.train.tiny.recipe``, with ``before_chain`` the model to continue) and ships the result with its
card to ``--out``, where ``generator.checkpoint=<out> generator.chain_steps=<steps>`` loads it. The
seventh session's chain, from the shipped default (experiments/results/tiny_lm.md has the scores):

    python experiments/probe_chain_continue.py 2000 --out /tmp/probe/c2            # 23 min, 1 thread
    python experiments/probe_chain_continue.py 4000 --base /tmp/probe/c2 --out /tmp/probe/c6   # 28 min
    python experiments/probe_chain_continue.py 4000 --base /tmp/probe/c6 --out /tmp/probe/c10
    python -m rag_lab.run experiment=tiny_lm generator.checkpoint=/tmp/probe/c6 generator.chain_steps=4000

Every stage draws its items from the same seeded stream, so a continuation first replays the batches of the
stage before it (renamed alike) and then draws new ones. The card ``--out`` gets records only the last
stage's ``chain_steps``, not the models it continued: the chain of ``--base`` arguments is the provenance.
"""

import argparse
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import OmegaConf

from rag_lab.core.config import compose
from rag_lab.train.tiny.generator import SHIPPED, recipe_part, recipe_settings
from rag_lab.train.tiny.recipe import train
from rag_lab.train.tiny.ship import ship


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("steps", type=int, help="the chain stage's batches")
    parser.add_argument("--base", type=Path, default=SHIPPED, help="the model to continue (default: shipped)")
    parser.add_argument("--out", type=Path, required=True, help="where to ship the continued model")
    args = parser.parse_args()
    overrides = [f"generator.chain_steps={args.steps}"]
    cfg = compose(["data=synth", "generator=tiny", *overrides])
    settings = recipe_settings(recipe_part(OmegaConf.to_container(cfg.generator, resolve=True)))
    path = train(instantiate(cfg.data), cfg.cache_dir, before_chain=args.base, **settings)
    print("shipped", ship(overrides, out=args.out, model=path))


if __name__ == "__main__":
    main()
