"""``policy=stoprag``: value-based stopping for an iterative RAG pipeline (Stop-RAG, arXiv:2510.14337;
docs/methods/stoprag.md).

``fit``: offline trajectories of the wrapped pipeline on the training questions (offline.py) →
the Q-network (qnet.py) trained on full-width forward-view Q(λ) targets (trainer.py, targets.py,
eqs. 8-12; λ annealed, cosine 1.0 → 0.1 by default) → τ tuned on the validation split (tau.py: every
τ of the grid scored exactly from one run of each dev question to the horizon; the best-F1 τ is kept).
``rollout``: the wrapped pipeline with :class:`QStopper` — stop when Q(s, STOP) − Q(s, CONT) > τ. The
Q-network and τ stay on the policy; the generator is the run's (a black box).

The wrapped loop is anything with the pipeline interface (``iterations``, ``iterate``, ``final``,
``sampling``, ``rollout`` with a ``stopper``): by default Stop-RAG's own
:class:`rag_lab.policies.stoprag.pipeline.IterativePipeline`, built from the same ``iterations`` / ``k`` /
``exclude_seen`` / ``max_new_tokens`` keys as ``policy=fixed_iter`` (so one override sets all three
policies of a comparison); any other loop with that interface can be passed as ``pipeline``. Those keys
and the Q-network's are declared once, in the pipeline and in :class:`~.qnet.QNetwork`.
A killed fit, rerun in the same run directory, ends byte-identical to an uninterrupted one; a
finished fit is reused. Every stage resumes from what it wrote, and whatever a later stage depends
on is either written or a pure function of the config:

- offline data and the dev trajectories: one flushed batch of rows at a time, batches fixed by the
  question order (offline.py), so a rerun batch holds the same prompts as in an uninterrupted run; the
  offline data is cached under ``cache_dir/stoprag/`` (:mod:`rag_lab.core.cache`: the corpus, the questions,
  the run's generator and retriever config, the pipeline's and the sampling's settings, the code), or,
  built outside the runner (no ``run_config``), kept in the run's ``checkpoints/``;
- state encodings: cached whole (atomic), and never memoised from one stage into the next (an
  encoding differs in the last bit with the other states of its forward pass);
- training: a checkpoint every ``checkpoint_every`` steps (atomic) holds the heads (the encoder too
  when it trains), AdamW, the lr schedule, the step, torch's RNG states (CPU and GPU: dropout), the
  log rows and ``stats``. The data order needs no state: epoch e is the (e+1)-th shuffle of one
  stream seeded by ``seed`` and step s is batch s mod B of epoch s // B (:func:`batches`); λ is a
  function of the step. Training starts from torch's RNG state right after the heads are
  initialised, whatever the generator did to it meanwhile (``generator=hf`` reseeds torch on every
  call, and a cached offline set makes no calls); numpy and python's global RNGs are not used;
- τ: a function of the trained network and the dev trajectories;
- the finished fit (Q-network, τ, its curve): cached under ``cache_dir/stoprag_fit/`` (the policy's config,
  the run's generator, retriever and seed, the questions, the code), so that another run with the same
  Stop-RAG (a stopper on R3-RAG's or APEX's loop: transfer.py) trains nothing.

Not results but costs, the generator-call counts of ``stoprag.json`` count the calls made: a kill
during data collection or τ tuning loses the killed process's count of those stages.
"""

import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch

from rag_lab.core import cache
from rag_lab.core.config import (
    NonNegative,
    OneOf,
    OpenUnit,
    Positive,
    PositiveInt,
    Probability,
    Range,
    settings_for,
    takes,
)
from rag_lab.core.devices import local_gpu
from rag_lab.core.errors import RagLabError
from rag_lab.core.records import atomic_write_json
from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode
from rag_lab.env.protocols.base import State
from rag_lab.eval.metrics import SCORERS
from rag_lab.policies.stoprag.offline import (
    CountingGenerator,
    Trajectory,
    collect,
    reward_sampling,
    stop_rewards,
)
from rag_lab.policies.stoprag.pipeline import IterativePipeline, traced_state
from rag_lab.policies.stoprag.qnet import QNetwork
from rag_lab.policies.stoprag.targets import SCHEDULES, TARGETS, lambda_at
from rag_lab.policies.stoprag.tau import heldout_at, tune_tau
from rag_lab.policies.stoprag.trainer import plain_data, rng_state, save_atomic, train_qnet
from rag_lab.train.curves import log_once
from rag_lab.train.parallel import is_main, processes, summed
from rag_lab.train.resume import load_torch

log = logging.getLogger(__name__)

# The Q-network's settings that make the frozen encoder's state encodings.
ENCODING = ("encoder", "pooling", "max_length", "truncation")


class QStopper:
    """The Stopper of the iterative pipeline: STOP where Q(s, STOP) − Q(s, CONT) > τ (t ≥ 1)."""

    def __init__(self, qnet: QNetwork, tau: float):
        self.qnet = qnet.eval()
        self.tau = tau

    @torch.no_grad()
    def margins(self, states: Sequence[State]) -> list[float]:
        inputs = [(s.question, [p.contents for t in s.turns for p in t.passages]) for s in states]
        stop, cont = self.qnet(inputs)
        return (stop - cont).tolist()

    def should_stop(self, env: Env, states: Sequence[State], episodes: Sequence[Episode]) -> list[bool]:
        asking = [i for i, s in enumerate(states) if s.turns]
        out = [False] * len(states)
        for i, margin in zip(
            asking, self.margins([states[i] for i in asking]) if asking else [], strict=True
        ):
            out[i] = margin > self.tau
        return out


@dataclass(eq=False)
class StopRAGSettings:
    """``policy=stoprag``'s own settings, declared once: :class:`StopRAG` takes each as a keyword
    (:func:`rag_lab.core.config.takes`, so the config schema lists them) and holds it as an attribute."""

    # offline data, state encodings and finished fits are cached under it
    cache_dir: str = "~/.cache/rag_lab"
    # offline data: N sampled final answers per state, scored with S
    samples: PositiveInt = 8
    temperature: Positive = 0.7
    top_p: OpenUnit = 0.9
    score: Annotated[str, OneOf(*SCORERS["squad"])] = "f1"
    # training questions used (null: all); 10% of them (by question) hold out a validation loss
    train_limit: PositiveInt | None = None
    val_fraction: Annotated[float, Range(0, 1, open_max=True)] = 0.1
    # targets: qlambda | mc | q0 | binary; λ schedule cosine | linear | constant
    target: Annotated[str, OneOf(*TARGETS)] = "qlambda"
    lambda_start: Probability = 1.0
    lambda_end: Probability = 0.1
    lambda_schedule: Annotated[str, OneOf(*SCHEDULES)] = "cosine"
    # optimisation (AdamW, cosine lr with warmup): learning rate, weight decay, the warmup's share of the
    # steps, states per batch, passes over the training states
    lr: Positive = 1e-3
    weight_decay: NonNegative = 0.01
    warmup_ratio: Annotated[float, Range(0, 1, open_max=True)] = 0.1
    batch_size: PositiveInt = 128
    epochs: Positive = 1.0
    # bf16 autocast on a GPU that supports it (CPU runs stay float32)
    bf16: bool = False
    # training steps between checkpoints (a killed fit resumes from the last)
    checkpoint_every: PositiveInt = 200
    # τ: tuned on the validation split over this grid, unless given
    tau: float | None = None
    tau_grid: list[float] | None = None
    # the first dev_limit validation questions tune τ (null: all)
    dev_limit: PositiveInt | None = None
    # seeds the heads' initialisation and the training data's order
    seed: int = 0
    # questions rolled out together when collecting trajectories (offline data, dev)
    batch_questions: PositiveInt = 64

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise RagLabError(f"policy.target must be one of {TARGETS}, got {self.target!r}")
        self.lambdas = (self.lambda_start, self.lambda_end, self.lambda_schedule)
        lambda_at(0.0, *self.lambdas)  # fail now on a bad schedule name
        # the margin is a difference of values in [0, 1], or of logits for the binary classifier
        default = (
            [round(-0.5 + 0.02 * i, 2) for i in range(51)]
            if self.target != "binary"
            else [round(-5.0 + 0.2 * i, 1) for i in range(51)]
        )
        self.tau_grid = list(self.tau_grid) if self.tau_grid else default


class StopRAG(StopRAGSettings):
    trains = True
    # each GPU's memory for its training (rag_lab.train.memory: python -m rag_lab.plan)
    memory_plan = "rag_lab.policies.stoprag.memory.plan"

    @takes(StopRAGSettings, IterativePipeline, QNetwork, drop=["stopper"])
    def __init__(
        self,
        # any object with the pipeline interface (null: Stop-RAG's own, from policy=fixed_iter's keys)
        pipeline: Any = None,
        # the run's resolved config (the offline data's cache key): filled by the runner
        run_config: dict | None = None,
        # StopRAGSettings' keys, the wrapped pipeline's (iterations, k, exclude_seen, max_new_tokens) and the
        # Q-network's (encoder, pooling, head_hidden, dropout, max_length, truncation, freeze_encoder)
        **settings: Any,
    ):
        super().__init__(**settings_for(StopRAGSettings, settings))
        self.pipeline = pipeline or IterativePipeline(**settings_for(IterativePipeline, settings))
        self.run_config = run_config
        self.qnet_args = settings_for(QNetwork, settings)
        self.qnet: QNetwork | None = None
        self.stats: dict = {}

    @staticmethod
    def global_batches(s: dict) -> dict[str, int]:
        """What the processes of a launched run split (:mod:`rag_lab.runner.launch`): the Q-network's batch of
        states (:mod:`.trainer`); the offline and dev rollouts share out batches of questions (offline.py)."""
        return {"batch_size": int(s["batch_size"])}

    # ---------------------------------------------------------------------------------------------
    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path, logger=None) -> None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(self.seed)
        self.qnet = QNetwork(**self.qnet_args).to(local_gpu() if torch.cuda.is_available() else "cpu")
        rng = rng_state()  # where training's dropout starts (module doc)
        final = out_dir / "qnet.pt"
        done = self.result_dir(env, train, dev)
        if done is not None and (done / "qnet.pt").exists() and not final.exists():
            log.info("Stop-RAG: the same fit ran before: %s", done)
            for f in done.iterdir():
                shutil.copy2(f, out_dir / f.name)
        saved = load_torch(final, map_location=self.device)  # damaged: trained again
        if saved is not None:
            self.qnet.load_state_dict(saved["model"], strict=False)
            self.tau = saved["tau"]
            self.stats = saved["stats"]
            log.info("Stop-RAG: reusing the trained Q-network and τ = %.3f from %s", self.tau, final)
            self.log_curve(out_dir, logger)
            return
        questions = train[: self.train_limit]
        offline = self.offline_path(env, questions, out_dir)
        counting = CountingGenerator(env.generator)
        env = env.with_generator(counting)
        # under launch every process rolls out its share of the batches, and gets every trajectory (collect)
        trajs = collect(
            self.pipeline,
            env,
            questions,
            offline,
            self.samples,
            self.temperature,
            self.top_p,
            self.score,
            batch_size=self.batch_questions,
        )
        self.stats["offline"] = {
            "questions": len(trajs),
            "generator_calls": summed(counting.calls),  # every process's calls
            "completions": summed(counting.completions),
            "naive_calls": len(trajs) * self.pipeline.iterations * (2 + self.samples),
        }
        calls = counting.calls  # a resumed training restores stats["offline"] from its checkpoint
        # the dev questions run to the horizon once: the held-out curve while training, then τ's tuning
        dev = dev[: self.dev_limit]
        dev_trajs = self.dev_trajectories(env, dev, out_dir)
        # a resumed training restores this too (the dev runs it read back from out_dir cost no call)
        self.stats["dev"] = {"generator_calls": summed(counting.calls - calls)}
        horizon = self.pipeline.iterations
        heldout = (lambda qnet: heldout_at(qnet, dev_trajs, dev, horizon)) if dev_trajs else None
        encoding = cache.key({k: self.qnet_args[k] for k in ENCODING}, code="rag_lab.policies.stoprag.qnet")
        self.train(trajs, out_dir, offline.with_name(f"{offline.stem}.states-{encoding}.pt"), rng, heldout)
        if self.tau is None:
            self.tune_tau(env, dev, out_dir, dev_trajs)
        self.qnet.clear_cache()  # the evaluation encodes as a reused fit does (module doc)
        self.stats["generator_calls"] = (
            self.stats["offline"]["generator_calls"] + self.stats["dev"]["generator_calls"]
        )
        self.stats["processes"] = processes()  # that trained the Q-network (launch)
        # stoprag.json first: a kill between the two leaves no qnet.pt, and the rerun writes both
        atomic_write_json(out_dir / "stoprag.json", {"tau": self.tau, **self.stats})
        plain = plain_data({"tau": self.tau, "stats": self.stats})
        save_atomic({"model": self.trainable_state(), **plain}, final)
        self.log_curve(out_dir, logger)
        if done is not None and not done.exists() and is_main():
            with cache.publish(done) as tmp:
                for name in ("qnet.pt", "stoprag.json", "tau_curve.csv", "tau_curve.png", "tau_curve.svg"):
                    if (out_dir / name).exists():
                        shutil.copy2(out_dir / name, tmp / name)

    @staticmethod
    def log_curve(out_dir: Path, logger) -> None:
        """The Q-network's training log (``train_log.jsonl``: loss, λ, lr, the held-out curve) to the run's
        logger, once, from the main process (a fit reused from the cache has no log to send)."""
        path = out_dir / "train_log.jsonl"
        if is_main() and path.exists():
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            log_once(rows, out_dir, logger)

    def result_dir(self, env: Env, train: list[QAExample], dev: list[QAExample]) -> Path | None:
        """Where a finished fit is kept for another run with the same policy config, generator, retriever,
        seed and questions (``cache_dir/stoprag_fit/<key>``; a stopper of another method's loop reuses the
        stoprag row's: rag_lab/policies/stoprag/transfer.py); None outside the runner."""
        if self.run_config is None:
            return None
        config = {k: self.run_config.get(k) for k in ("policy", "generator", "retriever", "seed")}
        questions = [[ex.id for ex in train[: self.train_limit]], [ex.id for ex in dev[: self.dev_limit]]]
        return cache.path(
            self.cache_dir,
            "stoprag_fit",
            env.corpus.fingerprint,
            questions,
            config,
            code="rag_lab.policies.stoprag.policy",
        )

    def offline_path(self, env: Env, questions: list[QAExample], out_dir: Path) -> Path:
        """The offline data's file: ``cache_dir/stoprag/<key>.jsonl`` (module doc), or with no
        ``run_config`` (built outside the runner) ``out_dir/offline/<key>.jsonl``, shared with nothing."""
        pipeline = self.pipeline
        settings = {
            "pipeline": type(pipeline).__qualname__,
            "iterations": pipeline.iterations,
            "k": getattr(pipeline, "k", None),
            "exclude_seen": getattr(pipeline, "exclude_seen", None),
            "max_new_tokens": pipeline.sampling.max_new_tokens,
            "samples": self.samples,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "score": self.score,
        }
        config = self.run_config or {}
        upstream = {k: config.get(k) for k in ("generator", "retriever", "seed")}
        root = self.cache_dir if self.run_config is not None else out_dir / "offline"
        where = cache.path(
            root,
            "stoprag",
            env.corpus.fingerprint,
            [ex.id for ex in questions],
            upstream,
            settings,
            code="rag_lab.policies.stoprag.offline",
        )
        return where.with_name(where.name + ".jsonl")

    @property
    def device(self) -> torch.device:
        return self.qnet.stop_head[1].weight.device

    def trainable_state(self) -> dict:
        state = self.qnet.state_dict()
        if self.qnet.frozen:  # the encoder is the pretrained one: keep only the heads
            state = {k: v for k, v in state.items() if not k.startswith("encoder.")}
        return state

    def train(
        self,
        trajs: list[Trajectory],
        out_dir: Path,
        features_path: Path | None = None,
        rng: dict | None = None,
        heldout=None,
    ) -> None:
        """Q(λ) regression (Algorithm 1) on ``trajs``: :func:`rag_lab.policies.stoprag.trainer.train_qnet`
        (``heldout``: its held-out curve's values)."""
        train_qnet(self, trajs, Path(out_dir), features_path, rng, heldout)

    # ---------------------------------------------------------------------------------------------
    def dev_trajectories(self, env: Env, dev: list[QAExample], out_dir: Path) -> list[Trajectory]:
        """The validation questions run once to the horizon, a greedy final answer at every state (kept in
        ``out_dir``: a second call reads them; under launch, the main process's)."""
        return collect(
            self.pipeline,
            env,
            dev,
            out_dir / "dev_trajectories.jsonl",
            samples=0,
            greedy_answers=True,
            batch_size=self.batch_questions,
            desc="stoprag τ tuning (dev)",
        )

    def tune_tau(
        self, env: Env, dev: list[QAExample], out_dir: Path, trajs: list[Trajectory] | None = None
    ) -> None:
        """Every τ of the grid on the validation split, from one run to the horizon (see module doc)."""
        trajs = self.dev_trajectories(env, dev, out_dir) if trajs is None else trajs
        horizon = self.pipeline.iterations
        self.tau, self.stats["tau"] = tune_tau(self.qnet, trajs, dev, horizon, self.tau_grid, out_dir)

    def own_rewards(self, env: Env, batch: list[QAExample], episodes: list[Episode]) -> list[float]:
        """The Q-learning reward of each evaluated episode's stop: r(s_t, STOP) of the state it answered
        from (eq. 13, its offline data's :func:`.offline.stop_rewards`: N = ``samples`` sampled answers);
        one generator call per batch. At s_T it is r(s_{T-1}, CONT) (eq. 14): the same quantity."""
        states = [traced_state(env.corpus, ep) for ep in episodes]
        sampling = reward_sampling(self.pipeline, self.samples, self.temperature, self.top_p)
        return stop_rewards(self.pipeline, env, states, [q.answers for q in batch], sampling, self.score)

    # ---------------------------------------------------------------------------------------------
    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        if self.qnet is None or self.tau is None:
            raise RuntimeError("Stop-RAG has no trained Q-network: run fit() first")
        self.pipeline.stopper = QStopper(self.qnet, self.tau)
        return self.pipeline.rollout(env, batch)
