"""One EVO-RAG training cycle (arXiv:2505.17391 sec. 3.3-3.5 and 3.7's Algorithm 1; docs/methods/evorag.md):
roll out the current policy and branch it (:mod:`.branches`), one preference-model epoch on the branch pairs
(:mod:`.preference`), one policy epoch of DPO with LoRA (:mod:`.dpo`), then the policy's exact match on the
dev questions (greedy), which the curriculum's stall rule and best-checkpoint choice read.

Each phase leaves its artefact in the cycle's work dir (``<done>.work/``) and is skipped on a resume when
it is there: ``branches.json`` (the nodes, their branches and returns, the counts), ``pm.pt`` + ``pm.json``
(the heads after the epoch, the accuracy on the new pairs before it, the loss), the DPO epoch's Trainer
checkpoints and ``log.jsonl``, ``merged/`` (the policy after it), ``dev.json``. The cycle is published to
``done`` in one rename (:func:`rag_lab.core.cache.publish`): the model, ``pm.pt``, ``log.jsonl``,
``pairs.jsonl`` (the DPO rows) and ``cycle.json``. Every random draw is seeded by (seed, stage, cycle), so
a killed cycle resumes to the numbers of an uninterrupted one.

With ``generator=vllm`` the rollouts, branches and dev EM generate on TRL's vLLM backend
(:func:`acting`; :mod:`rag_lab.train.vllm_engine`), into which TRL's sync loads the weights they act with
(after each DPO epoch, its LoRA adapter merged) before they generate, awake only while they do with
``generator.sleep`` (the DPO epoch between them has the GPU's memory).

Under ``launch`` no phase runs on the main process alone (issue 66): every process rolls out and branches its
share of the cycle's rollout batches and plays its share of the dev questions, and the results are gathered
(:func:`rag_lab.train.parallel.spread`), so N processes branch the pairs and measure the dev EM of one; the
preference model and DPO train in every process on its share of each batch.

Hand-written: the alternation of the two epochs and the cycle's bookkeeping; DPO is TRL's.
"""

import contextlib
import json
import logging
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import torch

from rag_lab.core import cache
from rag_lab.core.records import atomic_write_text, read_records
from rag_lab.data.base import QAExample
from rag_lab.env import Env
from rag_lab.env.engine import run_agent
from rag_lab.env.fit import tokenizer_of
from rag_lab.env.protocols.base import BACKTRACK, REFUSE
from rag_lab.eval.metrics import SCORERS
from rag_lab.generators.base import Sampling
from rag_lab.generators.vllm import rollouts_done
from rag_lab.policies.evorag import branches as br
from rag_lab.policies.evorag.dpo import dpo_epoch, dpo_rows
from rag_lab.policies.evorag.preference import Branch, PreferenceModel
from rag_lab.train.parallel import is_main, processes, publish_on_main, spread
from rag_lab.train.resume import load_model, load_torch

log = logging.getLogger(__name__)
COUNTS = ("episodes", "states", "branches", "pairs_pm", "pairs_dpo", "noop_backtracks", "prompt_too_long")


def cycle_seed(seed: int, stage: int, cycle: int) -> int:
    """The sampling seed of a cycle's rollouts (DAPO's pattern: a function of the run's seed and the step)."""
    return seed * 1_000_003 + stage * 10_007 + cycle * 101


@contextlib.contextmanager
def acting(policy, generator) -> Iterator:
    """What generates with ``generator``'s weights for one phase (rollouts, dev EM): the policy's vLLM engine
    (``policy.engine``, with ``generator=vllm``) once TRL's sync loaded them into it, awake for the phase
    (:meth:`rag_lab.train.vllm_engine.RolloutEngine.acting`), else ``generator`` itself."""
    engine = getattr(policy, "engine", None)
    if engine is None:
        yield generator
        return
    engine.sync(generator.model)
    with engine.acting() as actor:
        yield actor


def write_json(path: Path, value) -> None:
    atomic_write_text(path, json.dumps(value, indent=1, default=str) + "\n")


def batch_seed(seed: int, batch: int) -> int:
    """The sampling seed of rollout batch ``batch`` of a cycle seeded ``seed`` (batch 0: the cycle's own)."""
    return seed + 7_919 * batch


def collect(
    policy, generator, env: Env, stage: int, cycle: int, questions: list[QAExample], work: Path
) -> dict:
    """Branch the policy's rollouts on the cycle's questions (:mod:`.branches`); kept in ``branches.json``.

    The drawn questions are rolled out in batches of ``policy.rollout_batch``, batch b under its own seed
    (:func:`batch_seed`), so what a batch plays depends on its questions and its seed alone; under ``launch``
    process i rolls out batches i, i+N, ... and every process gets them all (:func:`spread`): N processes
    branch what one does. The main process writes ``branches.json``."""
    path = work / "branches.json"
    if path.exists():
        return json.loads(path.read_text())
    seed = cycle_seed(policy.seed, stage, cycle)
    drawn = random.Random(f"{policy.seed}/{stage}/{cycle}")
    picked = drawn.sample(questions, min(policy.questions_per_cycle, len(questions)))
    size = policy.rollout_batch
    batches = [picked[at : at + size] for at in range(0, len(picked), size)]

    with acting(policy, generator) as engine:  # the cycle's weights (vLLM: synced into its engine)

        def roll(units: list[int]) -> list[dict]:
            return [branch_batch(policy, engine, env, stage, batches[b], batch_seed(seed, b)) for b in units]

        # a TP group's engine: this rank joins the others' turns before the gather
        out = merged(spread(len(batches), roll, lambda: rollouts_done(engine)), policy.scorer)
    publish_on_main(lambda: write_json(path, out))
    return out


def branch_batch(policy, generator, env: Env, stage: int, picked: list[QAExample], seed: int) -> dict:
    """One batch of the cycle's questions rolled out under ``seed``, branched and scored: its nodes (their
    ``index``: the base episode's in the batch), each episode's monitors (:func:`episode_stats`), the counts,
    the verifier's calls."""
    acting_env = env.with_generator(generator)
    sampling = Sampling(
        temperature=policy.train_temperature,
        top_p=policy.top_p,
        max_new_tokens=policy.sampling.max_new_tokens,
        seed=seed,
    )
    counts = dict.fromkeys(COUNTS, 0)
    t_max, protocol = policy.max_turns, policy.protocol
    base, traces = br.base_rollouts(
        protocol, acting_env, picked, sampling, policy.k, t_max, policy.exclude_seen
    )
    nodes = br.visited(base, traces, policy.states_per_episode, f"{seed}/nodes", counts)
    siblings = br.replace_seed(sampling, 7)
    br.roll(protocol, acting_env, nodes, policy.actions, siblings, policy.k, t_max, counts)
    verifier = policy.reward.verifier if policy.reward.refusal == "verifier" else None
    asked = (verifier.calls, verifier.unparsed) if verifier is not None else None
    values, sibling_values = br.returns(policy.reward, base, nodes, picked, stage, t_max)
    out = {"nodes": [], "episodes": episode_stats(base, picked, policy.scorer), "verifier": None}
    if asked is not None:  # the verifier's calls for this batch, and its unparsable replies (scored failures)
        out["verifier"] = [verifier.calls - asked[0], verifier.unparsed - asked[1]]
    for node, sv in zip(nodes, sibling_values, strict=True):
        # the node's prompt and each action as the ids the policy was given and wrote (DPO's rows)
        b = br.node_branches(node, base[node.index], values[node.index], sv, tokenizer_of(generator))
        out["nodes"].append(
            {
                "index": node.index,
                "t": node.t,
                "prompt_ids": node.prompt_ids,
                "branches": [asdict(x) for x in b],
            }
        )
    counts["episodes"], counts["states"] = len(base), len(nodes)
    out["counts"] = counts
    return out


def merged(batches: list[dict], scorer: str) -> dict:
    """The cycle's branches from its batches' (:func:`branch_batch`), in batch order: the nodes (``index``:
    the base episode's in the cycle), the rollouts' means (:func:`rollout_stats`), the counts summed."""
    out, offset = {"nodes": [], "counts": dict.fromkeys(COUNTS, 0)}, 0
    for batch in batches:
        out["nodes"] += [node | {"index": offset + node["index"]} for node in batch["nodes"]]
        offset += len(batch["episodes"])
        out["counts"] = {k: out["counts"][k] + batch["counts"][k] for k in COUNTS}
    out["stats"] = rollout_stats([row for batch in batches for row in batch["episodes"]])
    asked = [batch["verifier"] for batch in batches if batch["verifier"] is not None]
    if asked:  # the verifier's calls for this cycle, and its unparsable replies
        out["stats"] |= {
            "verifier/calls": sum(a[0] for a in asked),
            "verifier/unparsed": sum(a[1] for a in asked),
        }
    return out


# each base episode's monitors, in this order (rollout_stats: their means)
MONITORS = ("rollout/em", "rollout/steps", "rollout/backtracks", "rollout/refused")


def episode_stats(base, questions: list[QAExample], scorer: str) -> list[list[float]]:
    """Each base rollout's EM, steps, backtracks and refusal (:data:`MONITORS`)."""
    em = SCORERS[scorer]["em"]
    return [
        [
            float(em(x.episode.prediction, list(q.answers))),
            float(len(x.episode.steps)),
            float(sum(s.action == BACKTRACK for s in x.episode.steps)),
            float(x.episode.stop_reason == REFUSE),
        ]
        for x, q in zip(base, questions, strict=True)
    ]


def rollout_stats(episodes: list[list[float]]) -> dict:
    """The base rollouts' means (:func:`episode_stats`' rows): the training curves' monitors."""
    n = max(len(episodes), 1)
    return {key: sum(row[i] for row in episodes) / n for i, key in enumerate(MONITORS)}


def pairs(data: dict, margin: float, per_state: int | None) -> list[list[tuple[Branch, Branch]]]:
    """Per node of ``data`` (:func:`collect`'s), its preference pairs at ``margin``."""
    nodes = [[Branch(**b) for b in node["branches"]] for node in data["nodes"]]
    return br.pairs_of(nodes, margin, per_state)


def pm_epoch(policy, pm: PreferenceModel, data: dict, seed: int, work: Path) -> dict:
    """One preference-model epoch on the cycle's pairs at Δ; its accuracy on them before (table 5's
    "internal accuracy") and its loss. Cached in ``pm.pt`` + ``pm.json``."""
    stats_path, weights_path = work / "pm.json", work / "pm.pt"
    saved = load_torch(weights_path)
    if stats_path.exists() and saved is not None:
        pm.heads.load_state_dict(saved)
        return json.loads(stats_path.read_text())
    pm.forget()  # the encoder pads per batch: each cycle embeds its texts afresh, as on a resume
    flat = [
        p for node in pairs(data, policy.preference.margin, policy.preference.pairs_per_state) for p in node
    ]
    stats = {"pm/pairs": len(flat), "pm/accuracy": pm.accuracy(flat) if flat else None, "pm/loss": None}
    if flat:  # under launch, every process on its share of each batch (rag_lab.train.parallel)
        stats["pm/loss"] = pm.fit(flat, 1, policy.preference.lr, policy.preference.batch_size, seed)[0]

    def write() -> None:
        torch.save(pm.heads.state_dict(), weights_path)
        write_json(stats_path, stats)

    publish_on_main(write)
    return stats


def policy_epoch(policy, generator, data: dict, seed: int, work: Path, what: str):
    """One DPO epoch on the widest pair per state at δ, from the current weights; the trained model
    (``merged/``, cached) and the epoch's counts."""
    merged = work / "merged"
    node_pairs = pairs(data, policy.margin, policy.pairs_per_state)
    rows = dpo_rows([node["prompt_ids"] for node in data["nodes"]], node_pairs)
    if is_main():
        atomic_write_text(work / "pairs.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    if (merged / "config.json").exists():
        return load_model(merged, like=generator.model), json.loads((work / "dpo.json").read_text())
    start = Path(generator.model.name_or_path)
    if not rows:
        log.info("%s: no pair passed the margin: the policy is unchanged", what)
        model, stats = load_model(start, like=generator.model), {"steps": 0, "resumed_from": None}
    else:
        model = load_model(start, like=generator.model)
        model, stats = dpo_epoch(model, generator, rows, policy, work / "dpo", seed, what)

    def write() -> None:
        with cache.publish(merged) as tmp:
            model.save_pretrained(tmp)
        write_json(work / "dpo.json", stats)

    publish_on_main(write)  # every process trained its share of each batch; the main one publishes
    return load_model(merged, like=generator.model), stats


def dev_em(policy, generator, env: Env, dev: list[QAExample], work: Path | None = None) -> float:
    """The policy's EM on ``dev``, greedy (the stall rule's signal); cached in ``dev.json``. Under ``launch``
    process i plays ``dev[i::N]`` and the scores are gathered (:func:`spread`; greedy, so a question's episode
    does not depend on the others it is batched with)."""
    path = work / "dev.json" if work is not None else None
    if path is not None and path.exists():
        return json.loads(path.read_text())["dev_em"]
    em = SCORERS[policy.scorer]["em"]
    with acting(policy, generator) as engine:
        actor = env.with_generator(engine)

        def scores(units: list[int]) -> list[float]:
            share = [dev[i] for i in units]
            episodes = run_agent(
                policy.protocol,
                share,
                actor,
                policy.sampling,
                policy.k,
                policy.max_turns,
                policy.exclude_seen,
            )
            return [float(em(e.prediction, list(q.answers))) for e, q in zip(episodes, share, strict=True)]

        # a TP group's engine: this rank joins the others' turns before the gather
        value = sum(spread(len(dev), scores, lambda: rollouts_done(engine))) / max(len(dev), 1)
    if path is not None:
        publish_on_main(lambda: write_json(path, {"dev_em": value}))
    return value


def run_cycle(policy, generator, env: Env, stage: int, cycle: int, questions, dev, pm, done: Path) -> None:
    """Cycle ``cycle`` of ``stage`` from ``generator``'s weights and ``pm``'s heads, published to ``done``."""
    work = done.with_name(f"{done.name}.work")
    work.mkdir(parents=True, exist_ok=True)
    what, began = f"EVO-RAG stage {stage} cycle {cycle}", time.perf_counter()
    seed = policy.seed * 1000 + stage * 100 + cycle
    # under launch every process rolls out and branches its share of the questions, and the preference model
    # and DPO train in every process, each on its share of every batch (rag_lab.train.parallel)
    data = collect(policy, generator, env, stage, cycle, questions, work)
    data["counts"]["pairs_pm"] = sum(
        map(len, pairs(data, policy.preference.margin, policy.preference.pairs_per_state))
    )
    data["counts"]["pairs_dpo"] = sum(map(len, pairs(data, policy.margin, policy.pairs_per_state)))
    log.info("%s: %s", what, ", ".join(f"{k} {v}" for k, v in data["counts"].items()))
    pm_stats = pm_epoch(policy, pm, data, seed, work)
    model, dpo_stats = policy_epoch(policy, generator, data, seed, work, what)
    trained = generator.with_model(model)
    em = dev_em(policy, trained, env, dev, work)
    log.info("%s: dev EM %.3f, preference accuracy %s", what, em, pm_stats["pm/accuracy"])
    publish_on_main(
        lambda: publish_cycle(done, work, model, data, em, pm_stats, dpo_stats, stage, cycle, began)
    )


def publish_cycle(done: Path, work: Path, model, data, em, pm_stats, dpo_stats, stage, cycle, began) -> None:
    """The cycle's model, heads, pairs, curve and summary, published to ``done`` in one rename."""
    with cache.publish(done) as tmp:
        model.save_pretrained(tmp)
        shutil.copy2(work / "pm.pt", tmp / "pm.pt")
        shutil.copy2(work / "pairs.jsonl", tmp / "pairs.jsonl")
        curve = work / "dpo" / "log.jsonl"
        rows = read_records(curve) if curve.exists() else []
        atomic_write_text(tmp / "log.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        summary = {"stage": stage, "cycle": cycle, "dev_em": em, "seconds": time.perf_counter() - began}
        summary |= {f"branch/{k}": v for k, v in data["counts"].items()} | data["stats"] | pm_stats
        summary |= {f"dpo/{k}": v for k, v in dpo_stats.items() if k not in ("device", "bf16")}
        summary["device"] = dpo_stats.get("device", str(model.device))
        summary["bf16"] = dpo_stats.get("bf16", False)
        summary["processes"] = processes()
        write_json(tmp / "cycle.json", summary)
    shutil.rmtree(work, ignore_errors=True)
