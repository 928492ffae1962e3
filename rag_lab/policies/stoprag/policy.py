"""``policy=stoprag``: value-based stopping for an iterative RAG pipeline (papers/stop-rag.txt;
METHODS.md §1).

``fit``: offline trajectories of the wrapped pipeline on the training questions (offline.py) →
the Q-network (qnet.py) trained on full-width forward-view Q(λ) targets (targets.py, eqs. 8-12;
λ annealed, cosine 1.0 → 0.1 by default) → τ tuned on the validation split (tau.py: every τ of the
grid scored exactly from one run of each dev question to the horizon; the best-F1 τ is kept).
``rollout``: the wrapped pipeline with :class:`QStopper` — stop when Q(s, STOP) − Q(s, CONT) > τ.

The wrapped loop is anything with the pipeline interface (``iterations``, ``iterate``, ``final``,
``sampling``, ``rollout`` with a ``stopper``): by default Stop-RAG's own
:class:`rag_lab.policies.pipeline.IterativePipeline`, built from the same ``iterations`` / ``k`` /
``exclude_seen`` / ``max_new_tokens`` keys as ``policy=fixed_iter`` (so one override sets all three
policies of a comparison); any other loop with that interface can be passed as ``pipeline``.
A killed fit, rerun in the same run directory, ends byte-identical to an uninterrupted one; a
finished fit is reused. Every stage resumes from what it wrote, and whatever a later stage depends
on is either written or a pure function of the config:

- offline data and the dev trajectories: one flushed batch of rows at a time, batches fixed by the
  question order (offline.py), so a rerun batch holds the same prompts as in an uninterrupted run;
- state encodings: cached whole (atomic), and never memoised from one stage into the next (an
  encoding differs in the last bit with the other states of its forward pass);
- training: a checkpoint every ``checkpoint_every`` steps (atomic) holds the heads (the encoder too
  when it trains), AdamW, the lr schedule, the step, torch's RNG states (CPU and GPU: dropout), the
  log rows and ``stats``. The data order needs no state: epoch e is the (e+1)-th shuffle of one
  stream seeded by ``seed`` and step s is batch s mod B of epoch s // B (:func:`batches`); λ is a
  function of the step. Training starts from torch's RNG state right after the heads are
  initialised, whatever the generator did to it meanwhile (``generator=hf`` reseeds torch on every
  call, and a cached offline set makes no calls); numpy and python's global RNGs are not used;
- τ: a function of the trained network and the dev trajectories.

Not results but costs, the generator-call counts of ``stoprag.json`` count the calls made: a kill
during data collection or τ tuning loses the killed process's count of those stages.
"""

import hashlib
import json
import logging
import math
import os
import random
from collections.abc import Iterator, Sequence
from copy import deepcopy
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from rag_lab.data.base import QAExample
from rag_lab.env import Env, Episode
from rag_lab.env.protocols.base import State
from rag_lab.errors import RagLabError
from rag_lab.policies.pipeline import IterativePipeline
from rag_lab.policies.stoprag.offline import CountingGenerator, Trajectory, cache_path, collect, states_of
from rag_lab.policies.stoprag.qnet import QNetwork
from rag_lab.policies.stoprag.targets import TARGETS, keep, lambda_at, targets
from rag_lab.policies.stoprag.tau import tune_tau
from rag_lab.records import atomic_write_json, atomic_write_text

log = logging.getLogger(__name__)


def batches(pairs: list, batch_size: int, seed: int, start: int = 0) -> Iterator[list]:
    """The training batches from step ``start`` on, a pure function of the arguments: epoch e is the
    (e+1)-th shuffle of one stream seeded by ``seed`` (a resume replays the e shuffles, cheap next to
    a step), and step s is batch s mod B of epoch s // B, B = ceil(len(pairs) / batch_size).

    >>> from itertools import islice
    >>> pairs = list(range(10))
    >>> list(islice(batches(pairs, 4, 0, start=5), 2)) == list(islice(batches(pairs, 4, 0), 7))[5:]
    True
    """
    per_epoch = math.ceil(len(pairs) / batch_size)
    rng = random.Random(f"{seed}:0")  # the stream's seed from before: uninterrupted runs keep their numbers
    epoch = 0
    while per_epoch:
        order = pairs[:]
        rng.shuffle(order)
        for b in range(max(0, start - epoch * per_epoch), per_epoch):
            yield order[b * batch_size : (b + 1) * batch_size]
        epoch += 1


def rng_state() -> dict:
    """Torch's RNG states (CPU, and every GPU's): what dropout draws from."""
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Back to a :func:`rng_state` (its tensors on any device: a checkpoint loads onto the GPU)."""
    torch.set_rng_state(state["cpu"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])


def save_atomic(obj, path: Path) -> None:
    """``torch.save`` to a temporary file, then rename: a kill never leaves a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def encoded_states(qnet: QNetwork, inputs: list[list[tuple]], path: Path | None) -> torch.Tensor | None:
    """[N, T-1, d] the frozen encoder's pooled states ``inputs[i][t-1]``, loaded from ``path`` when it
    is there, else encoded (256 a pass) and saved there."""
    if path is not None and path.exists():
        return torch.load(path, map_location=qnet.stop_head[1].weight.device)
    flat = [s for row in inputs for s in row]
    if not flat:
        return None
    chunks = tqdm(range(0, len(flat), 256), desc="encode states", unit="batch")
    pooled = [qnet.encode(flat[i : i + 256]) for i in chunks]
    features = torch.cat(pooled).view(len(inputs), len(inputs[0]), -1)
    if path is not None:
        save_atomic(features, path)
    return features


class QStopper:
    """The Stopper of the iterative pipeline: STOP where Q(s, STOP) − Q(s, CONT) > τ (t ≥ 1)."""

    def __init__(self, qnet: QNetwork, tau: float):
        self.qnet, self.tau = qnet.eval(), tau

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


class StopRAG:
    trains = True

    def __init__(
        self,
        # the wrapped pipeline (policy=fixed_iter's keys), or any pipeline object given as `pipeline`
        iterations: int = 10,
        k: int = 1,
        exclude_seen: bool = True,
        max_new_tokens: int = 32,
        pipeline: Any = None,
        cache_dir: str = "~/.cache/rag_lab",
        # offline data: N sampled final answers per state, scored with S
        samples: int = 8,
        temperature: float = 0.7,
        top_p: float = 0.9,
        score: str = "f1",
        # training questions used (null: all); 10% of them (by question) hold out a validation loss
        train_limit: int | None = None,
        val_fraction: float = 0.1,
        # targets: qlambda | mc | q0 | binary; λ schedule cosine | linear | constant
        target: str = "qlambda",
        lambda_start: float = 1.0,
        lambda_end: float = 0.1,
        lambda_schedule: str = "cosine",
        # the Q-network
        encoder: str = "sentence-transformers/all-MiniLM-L6-v2",
        pooling: str = "mean",
        head_hidden: int | None = None,
        dropout: float = 0.1,
        max_length: int = 512,
        truncation: str = "per_passage",
        freeze_encoder: bool = True,
        # optimisation (AdamW, cosine lr with warmup)
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        warmup_ratio: float = 0.1,
        batch_size: int = 128,
        epochs: float = 1.0,
        bf16: bool = False,
        checkpoint_every: int = 200,
        # τ: tuned on the validation split over this grid, unless given
        tau: float | None = None,
        tau_grid: list[float] | None = None,
        seed: int = 0,
        batch_questions: int = 64,
    ):
        if target not in TARGETS:
            raise RagLabError(f"policy.target must be one of {TARGETS}, got {target!r}")
        self.pipeline = pipeline or IterativePipeline(None, iterations, k, exclude_seen, max_new_tokens)
        self.cache_dir = cache_dir
        self.samples, self.temperature, self.top_p, self.score = samples, temperature, top_p, score
        self.train_limit, self.val_fraction = train_limit, val_fraction
        self.target = target
        self.lambdas = (lambda_start, lambda_end, lambda_schedule)
        lambda_at(0.0, *self.lambdas)  # fail now on a bad schedule name
        self.qnet_args = dict(encoder=encoder, pooling=pooling, head_hidden=head_hidden, dropout=dropout,
                              max_length=max_length, truncation=truncation,
                              freeze_encoder=freeze_encoder)  # fmt: skip
        self.lr, self.weight_decay, self.warmup_ratio = lr, weight_decay, warmup_ratio
        self.batch_size, self.epochs, self.bf16 = batch_size, epochs, bf16
        self.checkpoint_every = checkpoint_every
        self.tau = tau
        # the margin is a difference of values in [0, 1], or of logits for the binary classifier
        default = [round(-0.5 + 0.02 * i, 2) for i in range(51)] if target != "binary" else [
            round(-5.0 + 0.2 * i, 1) for i in range(51)]  # fmt: skip
        self.tau_grid = list(tau_grid) if tau_grid else default
        self.seed, self.batch_questions = seed, batch_questions
        self.qnet: QNetwork | None = None
        self.stats: dict = {}

    # ---------------------------------------------------------------------------------------------
    def fit(self, env: Env, train: list[QAExample], dev: list[QAExample], out_dir: Path, logger=None) -> None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(self.seed)
        self.qnet = QNetwork(**self.qnet_args).to("cuda" if torch.cuda.is_available() else "cpu")
        rng = rng_state()  # where training's dropout starts (module doc)
        final = out_dir / "qnet.pt"
        if final.exists():
            saved = torch.load(final, weights_only=False, map_location=self.device)
            self.qnet.load_state_dict(saved["model"], strict=False)
            self.tau, self.stats = saved["tau"], saved["stats"]
            log.info("Stop-RAG: reusing the trained Q-network and τ = %.3f from %s", self.tau, final)
            return
        questions = train[: self.train_limit]
        settings = dict(iterations=self.pipeline.iterations, k=self.pipeline.k, samples=self.samples,
                        temperature=self.temperature, top_p=self.top_p, score=self.score)  # fmt: skip
        offline = cache_path(self.cache_dir, env, questions, settings)  # keyed by the real generator
        counting = CountingGenerator(env.generator)
        env = Env(env.corpus, env.retriever, counting)
        trajs = collect(
            self.pipeline, env, questions, offline,
            self.samples, self.temperature, self.top_p, self.score, batch_size=self.batch_questions,
        )  # fmt: skip
        self.stats["offline"] = {
            "questions": len(trajs), "generator_calls": counting.calls, "completions": counting.completions,
            "naive_calls": len(trajs) * self.pipeline.iterations * (2 + self.samples),
        }  # fmt: skip
        encoder_key = json.dumps(
            {k: self.qnet_args[k] for k in ("encoder", "pooling", "max_length", "truncation")}
        )
        digest = hashlib.sha256(encoder_key.encode()).hexdigest()[:8]
        self.train(trajs, out_dir, offline.with_name(f"{offline.stem}.states-{digest}.pt"), rng)
        calls = counting.calls  # a resumed training restores stats["offline"] from its checkpoint
        if self.tau is None:
            self.tune_tau(env, dev, out_dir)
        self.qnet.clear_cache()  # the evaluation encodes as a reused fit does (module doc)
        self.stats["generator_calls"] = self.stats["offline"]["generator_calls"] + counting.calls - calls
        # stoprag.json first: a kill between the two leaves no qnet.pt, and the rerun writes both
        atomic_write_json(out_dir / "stoprag.json", {"tau": self.tau, **self.stats})
        save_atomic({"model": self.trainable_state(), "tau": self.tau, "stats": self.stats}, final)

    @property
    def device(self) -> torch.device:
        return self.qnet.stop_head[1].weight.device

    def trainable_state(self) -> dict:
        state = self.qnet.state_dict()
        if self.qnet.frozen:  # the encoder is the pretrained one: keep only the heads
            state = {k: v for k, v in state.items() if not k.startswith("encoder.")}
        return state

    # ---------------------------------------------------------------------------------------------
    def train(
        self,
        trajs: list[Trajectory],
        out_dir: Path,
        features_path: Path | None = None,
        rng: dict | None = None,
    ) -> None:
        """Q(λ) regression (Algorithm 1): sample a batch of kept states, bootstrap from the current
        network under no-grad over each state's future, squared error on both heads. With a frozen
        encoder the states are encoded once (and kept at ``features_path``, beside the offline data,
        so runs that differ only in targets, λ or seeds of the heads reuse them). Training starts
        from torch's RNG state ``rng`` (:func:`rng_state`; None: the current one), or resumes exactly
        from ``out_dir/qnet_checkpoint.pt`` (module doc)."""
        from transformers import get_cosine_schedule_with_warmup

        qnet, horizon = self.qnet, self.pipeline.iterations
        rewards = torch.tensor([t.rewards for t in trajs], dtype=torch.float32)  # [N, T+1]
        mask = keep(rewards)
        device = self.device
        rewards = rewards.to(device)
        order = list(range(len(trajs)))
        random.Random(self.seed).shuffle(order)
        n_val = int(round(self.val_fraction * len(trajs)))
        val_q, train_q = set(order[:n_val]), set(order[n_val:])
        pairs = [(i, t) for i in range(len(trajs)) for t in range(1, horizon) if mask[i, t]]
        train_pairs = [p for p in pairs if p[0] in train_q]
        val_pairs = [p for p in pairs if p[0] in val_q]
        self.stats["states"] = {"all": len(trajs) * (horizon - 1), "kept": len(pairs),
                                "train": len(train_pairs), "val": len(val_pairs)}  # fmt: skip
        inputs = [states_of(t, horizon - 1) for t in trajs]  # inputs[i][t-1] = s_t
        features = encoded_states(qnet, inputs, features_path) if qnet.frozen else None
        qnet.clear_cache()  # held in `features`; a cached file or a resume never filled the memo
        params = [p for p in qnet.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)
        per_epoch = max(1, math.ceil(len(train_pairs) / self.batch_size))
        total = max(1, math.ceil(self.epochs * per_epoch))
        sched = get_cosine_schedule_with_warmup(opt, int(self.warmup_ratio * total), total)
        ckpt, step, rows = out_dir / "qnet_checkpoint.pt", 0, []
        saved = torch.load(ckpt, weights_only=False, map_location=device) if ckpt.exists() else None
        if saved is not None and "rng" not in saved:
            log.warning("Stop-RAG: %s predates exact resumption; training from step 0", ckpt)
            saved = None
        if saved is not None:
            qnet.load_state_dict(saved["model"], strict=False)
            opt.load_state_dict(saved["optimizer"])
            sched.load_state_dict(saved["scheduler"])
            step, rows, rng = saved["step"], saved["log"], saved["rng"]
            self.stats.update(saved["stats"])
            log.info("Stop-RAG: resuming Q-network training at step %d / %d", step, total)
        if rng is not None:
            set_rng_state(rng)
        log_path = out_dir / "train_log.jsonl"  # the checkpoint's rows: none after it, none twice
        atomic_write_text(log_path, "".join(json.dumps(row) + "\n" for row in rows))
        # bf16 where supported (a GPU with bf16); CPU runs stay in float32
        amp = self.bf16 and device.type == "cuda" and torch.cuda.is_bf16_supported()

        def q_values(rows: list[int], grad: bool, ts: list[int] | None = None):
            """Q at s_1..s_{T-1} of each row (no grad), or at (row, t) pairs (with grad)."""
            if ts is not None:
                if features is not None:
                    return qnet.heads(features[rows, [t - 1 for t in ts]])
                return qnet([inputs[r][t - 1] for r, t in zip(rows, ts, strict=True)])
            with torch.no_grad():
                if features is not None:
                    s, c = qnet.heads(features[rows].flatten(0, 1))
                else:
                    s, c = qnet([st for r in rows for st in inputs[r]])
            pad = torch.zeros(len(rows), 1, device=device)
            return (
                torch.cat([pad, s.view(len(rows), -1), pad], 1),
                torch.cat([pad, c.view(len(rows), -1), pad], 1),
            )

        def loss_of(batch: list[tuple[int, int]], lam: float) -> torch.Tensor:
            rows = [i for i, _ in batch]
            ts = torch.tensor([t for _, t in batch], device=device)
            bootstrap = self.target in ("qlambda", "q0")
            was = qnet.training
            qnet.eval()
            qs, qc = q_values(rows, grad=False) if bootstrap else (None, None)
            qnet.train(was)
            stop_t, cont_t = targets(self.target, rewards[rows], ts, qs, qc, lam)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                stop, cont = q_values(rows, grad=True, ts=ts.tolist())
            stop, cont = stop.float(), cont.float()
            if self.target == "binary":
                return torch.nn.functional.binary_cross_entropy_with_logits(
                    stop - cont, cont_t, reduction="sum"
                )
            return ((stop_t - stop) ** 2 + (cont_t - cont) ** 2).sum()

        bar = tqdm(total=total, initial=step, desc=f"Stop-RAG Q({self.target})", unit="step")
        qnet.train()
        if qnet.frozen:
            qnet.encoder.eval()
        for batch in batches(train_pairs, self.batch_size, self.seed, step):
            if step >= total:
                break
            lam = lambda_at(step / total, *self.lambdas)
            loss = loss_of(batch, lam)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item() / self.batch_size:.4f}", lam=f"{lam:.2f}")
            if step % self.checkpoint_every == 0 or step == total:
                row = {"step": step, "loss": loss.item() / len(batch), "lambda": lam,
                       "lr": sched.get_last_lr()[0]}  # fmt: skip
                if val_pairs:
                    qnet.eval()
                    with torch.no_grad():  # in training-size chunks (a fine-tuned encoder's memory)
                        chunks = range(0, len(val_pairs), self.batch_size)
                        val = sum(loss_of(val_pairs[c : c + self.batch_size], lam).item() for c in chunks)
                        row["val_loss"] = val / len(val_pairs)
                    qnet.train()
                    if qnet.frozen:
                        qnet.encoder.eval()
                rows.append(row)
                self.stats["train"] = row
                state = {"model": self.trainable_state(), "optimizer": opt.state_dict(),
                         "scheduler": sched.state_dict(), "step": step, "rng": rng_state(), "log": rows,
                         "stats": deepcopy(self.stats)}  # fmt: skip
                save_atomic(state, ckpt)
                with log_path.open("a") as f:
                    f.write(json.dumps(row) + "\n")
        bar.close()
        qnet.eval()

    # ---------------------------------------------------------------------------------------------
    def tune_tau(self, env: Env, dev: list[QAExample], out_dir: Path) -> None:
        """Every τ of the grid on the validation split, from one run to the horizon (see module doc)."""
        trajs = collect(self.pipeline, env, dev, out_dir / "dev_trajectories.jsonl", samples=0,
                        greedy_answers=True, batch_size=self.batch_questions,
                        desc="stoprag τ tuning (dev)")  # fmt: skip
        horizon = self.pipeline.iterations
        self.tau, self.stats["tau"] = tune_tau(self.qnet, trajs, dev, horizon, self.tau_grid, out_dir)

    # ---------------------------------------------------------------------------------------------
    def rollout(self, env: Env, batch: list[QAExample]) -> list[Episode]:
        if self.qnet is None or self.tau is None:
            raise RuntimeError("Stop-RAG has no trained Q-network: run fit() first")
        self.pipeline.stopper = QStopper(self.qnet, self.tau)
        return self.pipeline.rollout(env, batch)
