"""R3-RAG's PPO loop (:mod:`.ppo` is one iteration's math): rollouts, rewards, samples, the update, a log row,
a checkpoint; resumed after a kill from the last good checkpoint.

The work dir holds ``checkpoint-<iteration>/`` (``state.json`` with the log rows so far, and in ``sharded/``
the policy's, the value head's, the critic's and the optimizer's states as torch's distributed checkpoint:
each process writes its own shards, and it resumes into any number of processes; only the newest is kept)
and ``log.jsonl``.
:meth:`PPOTrainer.run` ends by saving the trained policy and critic to its ``out`` dir. One log row per
iteration: the reward parts (process, outcome, per-step), the rollouts' accuracy, format failures and steps,
the policy and value losses, the KL to the initial model, the clip fraction, the mean ratio, the explained
variance of the critic's values before the update, samples and tokens, the judges' unparsed replies.

With ``generator=vllm`` the rollouts (and the held-out curve's episodes) generate on TRL's vLLM backend
(:mod:`rag_lab.train.vllm_engine`: colocated engine or ``trl vllm-serve`` server), into which TRL's sync
loads the policy's weights after every update, before the next rollouts (and after a resume), awake only for
them with ``generator.sleep``; the log-probs PPO trains on are still the policy's own (:func:`.ppo.score`).
Otherwise they generate with transformers on the policy itself: under FSDP / ZeRO-3 the sharded actor-critic,
every process's forwards in step until all have played their episodes (:mod:`rag_lab.train.lockstep`).

Hand-written: TRL 1.16 has no PPO trainer (:mod:`.ppo`).
"""

import contextlib
import json
import logging
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from rag_lab.core.errors import RagLabError
from rag_lab.core.records import RecordWriter, atomic_write_text
from rag_lab.data.base import QAExample
from rag_lab.env import Env
from rag_lab.env.engine import run_agent
from rag_lab.generators.base import Sampling
from rag_lab.generators.vllm import rollouts_done
from rag_lab.policies.r3rag.losses import explained_variance
from rag_lab.policies.r3rag.model import ActorCritic
from rag_lab.policies.r3rag.ppo import (
    PPOSettings,
    advantages,
    build,
    check_samples,
    global_stats,
    global_sum,
    score,
    update,
)
from rag_lab.policies.r3rag.samples import CutDocuments, rollouts, step_samples, tensors
from rag_lab.train.heldout import HeldOut, measured
from rag_lab.train.lockstep import generating
from rag_lab.train.resume import last_good_checkpoint
from rag_lab.train.sharded import (
    as_loaded,
    fsdp_modules,
    full_state_dict,
    load_sharded,
    merged_copy,
    save_sharded,
    zero3,
)
from rag_lab.train.vllm_engine import rollout_engine

log = logging.getLogger(__name__)
# a checkpoint's states (torch's distributed checkpoint), beside its state.json
SHARDED = "sharded"


def iteration_seed(seed: int, iteration: int, process: int = 0) -> int:
    """The sampling seed of an iteration's rollouts on one process."""
    return seed * 1_000_003 + iteration * 101 + process * 7


@dataclass
class Rollout:
    """How the policy acts while it trains (``policy=r3rag``'s rollout keys)."""

    protocol: object
    k: int = 3
    max_turns: int = 5
    max_new_tokens: int = 64
    top_p: float = 1.0


class PPOTrainer:
    def __init__(
        self,
        generator,
        env: Env,
        reward,
        questions: Sequence[QAExample],
        settings: PPOSettings,
        rollout: Rollout,
        seed: int = 0,
        accelerator=None,
        heldout: HeldOut | None = None,
        heldout_questions: Sequence[QAExample] = (),
        scorer: str = "squad",
    ):
        from rag_lab.policies.r3rag.ppo import make_accelerator

        self.accelerator = accelerator or make_accelerator()
        self.settings = settings
        self.rollout = rollout
        self.seed = seed
        self.reward = reward
        self.questions = list(questions)
        self.base = generator
        if settings.batch_size % self.accelerator.num_processes:
            raise ValueError(
                f"policy.ppo.batch_size {settings.batch_size} is not a multiple of the "
                f"{self.accelerator.num_processes} processes"
            )
        self.model, self.reference, self.optimizer = build(generator.model, settings, self.accelerator)
        self.env = CutDocuments(env.corpus, env.retriever, None, max_chars=settings.max_doc_chars)
        self.heldout = heldout or HeldOut(n=0)
        self.heldout_questions = list(heldout_questions)
        self.scorer = scorer
        # generator=vllm: the engine the rollouts generate on (None: the policy itself, with transformers)
        self.engine = rollout_engine(
            env.generator, self.unwrapped.lm, generator.tokenizer, generator.chat, self.accelerator
        )

    @property
    def unwrapped(self):
        return self.accelerator.unwrap_model(self.model)

    @contextlib.contextmanager
    def acting(self) -> Iterator[Env]:
        """The environment acting with the policy as it is now, for one phase (every process enters it at
        the same point): on its synced vLLM engine (awake for the phase), or on the policy itself, under
        FSDP / ZeRO-3 the sharded actor-critic's LM, every process's forwards in step until the phase ends
        (:func:`rag_lab.train.lockstep.generating`)."""
        if self.engine is not None:
            with self.engine.acting() as generator:
                yield self.env.with_generator(generator)
            return
        with generating(self.base, self.model, self.accelerator, lm=self.unwrapped.lm) as generator:
            yield self.env.with_generator(generator)

    def gathered(self) -> ActorCritic | None:
        """The trained policy to save: the model itself, or under FSDP / ZeRO-3 (a collective) an unsharded
        one built on the main process around its full weights, gathered once there in host memory in the
        dtype the LM was loaded in (:func:`rag_lab.train.sharded.full_state_dict`); None on the others."""
        if not (fsdp_modules(self.model) or zero3(self.accelerator)):
            return self.unwrapped
        weights = full_state_dict(self.model, self.accelerator)
        if not self.accelerator.is_main_process:
            return None
        inner = self.unwrapped

        def part(prefix: str, like) -> dict:
            return as_loaded({k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}, like)

        critic = None
        if inner.critic_lm is not None:
            critic = merged_copy(inner.critic_lm, part("critic_lm.", inner.critic_lm))
        plain = ActorCritic(merged_copy(inner.lm, part("lm.", inner.lm)), self.settings.critic, critic)
        plain.head.load_state_dict({k[5:]: v for k, v in weights.items() if k.startswith("head.")})
        return plain

    def run(self, work: Path, out: Path) -> list[dict]:
        """Train ``settings.iterations`` iterations (resuming from ``work``), save the policy to ``out``; the
        log rows."""
        work.mkdir(parents=True, exist_ok=True)
        start, rows = self.resume(work)
        writer = RecordWriter(work / "log.jsonl") if self.accelerator.is_main_process else None
        if writer is not None:
            atomic_write_text(work / "log.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
        bar = tqdm(
            range(start, self.settings.iterations),
            desc="r3rag PPO",
            disable=not self.accelerator.is_main_process,
            initial=start,
            total=self.settings.iterations,
        )
        if start == 0:
            rows += self.measure(0, writer)
        for it in bar:
            row = self.iteration(it)
            rows.append(row)
            if writer is not None:
                writer.write([row])
            bar.set_postfix(acc=f"{row['rollout/acc']:.2f}", kl=f"{row['kl']:.3f}")
            if self.heldout.due(it + 1, self.settings.iterations):
                rows += self.measure(it + 1, writer)
            if (it + 1) % self.settings.save_steps == 0 or it + 1 == self.settings.iterations:
                self.checkpoint(work, it + 1, rows)
        policy = self.gathered()
        if self.accelerator.is_main_process:
            policy.save(out)
        self.accelerator.wait_for_everyone()
        return rows

    def measure(self, step: int, writer: RecordWriter | None) -> list[dict]:
        """The held-out curve's row at ``step`` (:mod:`rag_lab.train.heldout`: the greedy policy on the
        held-out questions), each process measuring its share (:func:`measured`); the row on the main
        process, [] on the others and without held-out questions."""
        if not self.heldout_questions:
            return []
        r = self.rollout
        sampling = Sampling(max_new_tokens=r.max_new_tokens)
        with self.acting() as env:  # every process, one with no held-out question too

            def rollout(share: list) -> list:
                return run_agent(r.protocol, share, env, sampling, r.k, r.max_turns)

            finish = env.generator  # the phase's end, before the gather (every process)
            row = measured(step, self.heldout_questions, rollout, self.scorer, lambda: rollouts_done(finish))
        if row is None:
            return []
        row |= {"stage": "ppo"}
        if writer is not None:
            writer.write([row])
        return [row]

    def iteration(self, it: int) -> dict:
        """One PPO iteration (:mod:`.ppo`); its log row."""
        start, acc = time.perf_counter(), self.accelerator
        drawn = random.Random(f"{self.seed}/{it}").sample(
            self.questions, min(self.settings.batch_size, len(self.questions))
        )
        mine = drawn[acc.process_index :: acc.num_processes]
        r = self.rollout
        sampling = Sampling(
            max_new_tokens=r.max_new_tokens,
            top_p=r.top_p,
            seed=iteration_seed(self.seed, it, acc.process_index),
        )
        with self.acting() as env:  # the phase ends once every process has played its episodes
            examples, live, traces = rollouts(
                r.protocol, env, mine, self.settings.temperatures, sampling, r.k, r.max_turns
            )
        episodes = [x.episode for x in live]
        rewards, parts = self.reward.score(episodes, examples, lambda i, j: live[i].state.turns[j].passages)
        samples = step_samples(live)  # the ids each step was given and sampled
        check_samples(len(samples), acc)  # before this process builds its batch: all raise, or none
        pad = self.base.tokenizer.pad_token_id
        batch = {k: v.to(acc.device) for k, v in tensors(samples, pad).items()}
        batch = score(self.model, self.reference, batch, self.settings.micro_batch, self.accelerator)
        batch = advantages(samples, rewards, batch, self.settings, acc)
        ev = self.explained_variance(batch)
        stats = update(self.model, self.optimizer, batch, self.settings, acc, iteration_seed(self.seed, it))
        if self.engine is not None:  # the updated weights into the engine, before the next rollouts
            self.engine.sync()
        n = len(episodes)
        row = {"step": it + 1, "stage": "ppo", "time": time.time()}
        # each process's parts are means over its own episodes (equal shares): their mean is the batch's
        row |= {k: global_stats([v], acc)[0] for k, v in parts.items() if k != "judge/unparsed"}
        row["judge/unparsed"] = global_sum(parts["judge/unparsed"], acc)
        row |= stats | {"explained_variance": ev}
        row["rollout/steps"] = global_sum(sum(len(e.steps) for e in episodes), acc) / global_sum(n, acc)
        row["samples"] = global_sum(len(samples), acc)
        row["tokens"] = global_sum(float(batch["mask"].sum()), acc)
        row["wall_s"] = time.perf_counter() - start
        return row

    def explained_variance(self, batch: dict) -> float:
        """The critic's explained variance of the returns, before the update, over every process."""
        if self.accelerator.num_processes == 1:
            values, returns = batch["old_values"], batch["returns"]
        else:
            from accelerate.utils import gather_object

            pairs = gather_object(
                [list(zip(batch["old_values"].tolist(), batch["returns"].tolist(), strict=True))]
            )
            values, returns = (torch.tensor([p[i] for part in pairs for p in part]) for i in (0, 1))
        return explained_variance(values[None].cpu(), returns[None].cpu(), torch.ones(1, len(values)))

    def checkpoint(self, work: Path, iteration: int, rows: list[dict]) -> None:
        """``checkpoint-<iteration>`` (written beside, then renamed), the older ones removed: ``state.json``
        and the policy's, the critic's and the optimizer's states in ``sharded/``, torch's distributed
        checkpoint (every process writes its own shards: nothing is gathered; one shard in one process)."""
        main, final = self.accelerator.is_main_process, work / f"checkpoint-{iteration}"
        tmp = work / f".checkpoint-{iteration}.tmp"
        if main:
            shutil.rmtree(tmp, ignore_errors=True)
        self.accelerator.wait_for_everyone()  # before any process writes into it
        save_sharded(tmp / SHARDED, self.model, self.optimizer)
        if main:
            (tmp / "state.json").write_text(json.dumps({"iteration": iteration, "rows": rows}) + "\n")
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            for old in work.glob("checkpoint-*"):
                if old != final:
                    shutil.rmtree(old, ignore_errors=True)
        self.accelerator.wait_for_everyone()

    def resume(self, work: Path) -> tuple[int, list[dict]]:
        """(the iteration to start from, the log rows so far): from the last good checkpoint, or (0, []). The
        checkpoint loads into any number of processes (torch's distributed checkpoint reshards it)."""
        last = last_good_checkpoint(work)
        if last is None:
            return 0, []
        path = Path(last)
        # written last: torch's distributed checkpoint's .metadata, a ZeRO-3 engine's latest
        if not any((path / SHARDED / name).exists() for name in (".metadata", "latest")):
            raise RagLabError(
                f"r3rag PPO: {path}/{SHARDED} is incomplete: remove {path} to resume from the one before"
            )
        load_sharded(path / SHARDED, self.model, self.optimizer)
        if self.engine is not None:
            self.engine.sync()
        state = json.loads((path / "state.json").read_text())
        log.info("r3rag PPO: resuming from %s (iteration %d)", path, state["iteration"])
        return state["iteration"], state["rows"]
