"""Probe (issue 48, ninth session): does APEX's plan RL learn when the planner plans wrong?

On the default LM, plan RL has nothing to learn: the LM's recipe imitates the world teacher's plans, which
are the gold decompositions SEPR scores against, so its plans score SEPR ~0.97 before any RL
(experiments/results/compare_synth.md). This probe gives plan RL something to fix:

1. The shipped tiny LM is fine-tuned (TRL SFT, ``rag_lab.train.sft``) on the ``apex_plan`` prompt of each
   training question. Its target is the gold plan, or, with probability ``--wrong``, the plan cut to its
   first step (1-hop questions, whose plan is one step, stay right). Under-decomposition is what a
   zero-shot planner gets wrong most often.
2. Greedy SEPR on the test questions' plans is measured before and after plan RL. Plan RL is the demo's
   (``PlannerRL``: GRPO with SEPR, groups of 8, 4 questions a step, one epoch over 100 questions, 25 steps)
   and ``--epochs`` / ``--limit`` can lengthen it.
3. Each planner then runs APEX's whole loop on the same test questions (greedy), with the demo's executor
   (make demo's shared cold start, shipped), and its Acc is compared with the wrong planner's by a paired
   bootstrap over questions.

It measures the trainer on a planner that has something to learn, not the paper's claim.

    python experiments/probe_apex_imperfect_planner.py --out /tmp/apex_probe/s0 --seed 0   # ~3 min, 2 cores
    python experiments/probe_apex_imperfect_planner.py --pool /tmp/apex_probe/s0 /tmp/apex_probe/s1 ...

``--pool``: plan RL's Acc gain over the wrong planner across seeds, each bootstrap draw a question with all
its seeds (the ninth session's +18.1 over seeds 0-2).
"""

import argparse
import json
import random
from dataclasses import replace
from pathlib import Path

from hydra.utils import instantiate

from rag_lab.core.config import build, compose
from rag_lab.env import Env
from rag_lab.env.protocols.apex import APEXPlan
from rag_lab.env.protocols.base import PLAN, Action, State
from rag_lab.eval.metrics import accuracy
from rag_lab.eval.stats import paired_bootstrap
from rag_lab.generators.base import Sampling
from rag_lab.generators.hf import HFGenerator
from rag_lab.policies.apex.pipeline import APEXPipeline
from rag_lab.policies.apex.planner import PlannerRL, train_planner
from rag_lab.rewards.sepr import gold_plan
from rag_lab.train.sft import SFTSettings, sft

SHIPPED_COLD = Path(__file__).resolve().parents[1] / "rag_lab" / "checkpoints" / "cold_start"


def plan_pairs(questions, wrong: float, seed: int) -> list[tuple]:
    """(apex_plan prompt, plan) for every question with a gold plan; the plan cut to its first step with
    probability ``wrong`` (plans of one step cannot be cut)."""
    rng, protocol = random.Random(seed), APEXPlan()
    pairs = []
    for q in questions:
        plan = tuple(s.question for s in q.decomposition)
        if len(plan) > 1 and rng.random() < wrong:
            plan = plan[:1]
        pairs.append((protocol.prompt(State(q.question)), protocol.format(Action(PLAN, plan=plan))))
    return pairs


def greedy_sepr(generator: HFGenerator, questions, sepr) -> dict:
    """Greedy plans for ``questions``: their mean SEPR against the gold plans, and mean step count."""
    prompts = [APEXPlan().prompt(State(q.question)) for q in questions]
    texts = [c[0].text for c in generator.generate(prompts, Sampling(max_new_tokens=64))]
    scores = sepr(texts, [gold_plan(q) for q in questions])
    steps = [len(APEXPlan().parse(t).plan or ()) for t in texts]
    return {"sepr": sum(scores) / len(scores), "steps": sum(steps) / len(steps), "n": len(questions)}


class PlannedBy(APEXPipeline):
    """APEX's loop (the demo's hops, k and tokens) with the plans from ``planner``."""

    def __init__(self, planner: HFGenerator, **loop):
        super().__init__(**loop)
        self.planner = planner

    def plan_env(self, env: Env) -> Env:
        return env.with_generator(self.planner)


def loop_acc(env: Env, planner: HFGenerator, questions, loop: dict) -> list[float]:
    """Each question's Acc through APEX's loop, plans from ``planner``, ``env``'s executor."""
    episodes = PlannedBy(planner, **loop).rollout(env, questions)
    return [accuracy(ep.prediction, list(q.answers)) for ep, q in zip(episodes, questions, strict=True)]


def pool(outs: list[Path]) -> None:
    """Plan RL − the wrong planner (Acc) over the runs in ``outs`` (one a seed), questions resampled with
    all their seeds."""
    a, b, questions, seeds = [], [], [], []
    for out in outs:
        acc = json.loads((out / "results.json").read_text())["acc_by_question"]
        a += acc["plan_rl"]
        b += acc["wrong"]
        questions += [str(i) for i in range(len(acc["wrong"]))]
        seeds += [str(out)] * len(acc["wrong"])
    print(paired_bootstrap(a, b, questions=questions, seeds=seeds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--pool", type=Path, nargs="+", help="runs' --out folders: their pooled gain")
    parser.add_argument("--wrong", type=float, default=0.5)
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--limit", type=int, default=100)
    parser.add_argument("--test", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0, help="the cut plans', the SFT's and plan RL's seed")
    args = parser.parse_args()
    if args.pool:
        return pool(args.pool)
    if args.out is None:
        parser.error("--out (or --pool) is required")
    cfg = compose(["generator=tiny", "policy=apex", "reward=sepr"])
    data = instantiate(cfg.data)
    base = build(cfg.generator, data=data)
    sepr = build(cfg.reward)
    train = [q for q in data.split("train") if q.decomposition]
    test = [q for q in data.split("test") if q.decomposition][: args.test]
    model_dir, tokenizer_dir = base.model.name_or_path, base.tokenizer.name_or_path
    settings = {"chat": False, "batch_size": 64, "seed": 0, "dtype": "float32"}
    results = {"base": greedy_sepr(base, test, sepr)}
    print("base", results["base"], flush=True)

    wrong_dir = args.out / "wrong_planner"
    if not (wrong_dir / "config.json").exists():
        trainer, stats = sft(
            model_dir,
            tokenizer_dir,
            plan_pairs(train, args.wrong, args.seed),
            SFTSettings(max_steps=args.sft_steps, batch_size=8, lr=1e-3, save_steps=10_000, seed=args.seed),
            args.out / "sft_work",
        )
        trainer.model.save_pretrained(wrong_dir)
    wrong = HFGenerator(str(wrong_dir), str(tokenizer_dir), **settings)
    results["wrong"] = greedy_sepr(wrong, test, sepr)
    print("wrong planner", results["wrong"], flush=True)

    config = replace(PlannerRL(), epochs=args.epochs, train_limit=args.limit, seed=args.seed)
    if not (args.out / "plan_rl" / "train.json").exists():
        # a copy of its own: train_planner trains the model it is given in place
        learner = HFGenerator(str(wrong_dir), str(tokenizer_dir), **settings)
        train_planner(learner, train, sepr, config, args.out / "plan_rl")
    stats = json.loads((args.out / "plan_rl" / "train.json").read_text())
    trained = HFGenerator(str(args.out / "plan_rl"), str(tokenizer_dir), **settings)
    results["plan_rl"] = greedy_sepr(trained, test, sepr) | {"steps_trained": stats["steps"]}
    print("after plan RL", results["plan_rl"], flush=True)
    # make demo's shared cold start, the one shipped beside the default LM
    (executor_dir,) = [d for d in SHIPPED_COLD.iterdir() if d.is_dir()]
    executor = HFGenerator(str(executor_dir), str(executor_dir / "tokenizer"), **settings)
    env = Env(data.corpus, build(cfg.retriever, corpus=data.corpus), executor)
    loop = {k: cfg.policy[k] for k in ("plan", "hops", "k", "max_new_tokens", "temperature")}
    acc = {
        name: loop_acc(env, g, test, loop)
        for name, g in [("base", base), ("wrong", wrong), ("plan_rl", trained)]
    }
    for name, values in acc.items():
        results[name]["acc"] = 100 * sum(values) / len(values)
    gain = paired_bootstrap(acc["plan_rl"], acc["wrong"])
    results["acc_plan_rl_minus_wrong"] = [
        100 * gain.delta,
        100 * gain.ci_low,
        100 * gain.ci_high,
        gain.p_value,
    ]
    print("Acc", {n: r.get("acc") for n, r in results.items() if isinstance(r, dict)}, gain, flush=True)
    curve = [json.loads(line) for line in (args.out / "plan_rl" / "log.jsonl").read_text().splitlines()]
    results["train_reward"] = [round(r["reward"], 3) for r in curve if "reward" in r]
    results["acc_by_question"] = acc
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
