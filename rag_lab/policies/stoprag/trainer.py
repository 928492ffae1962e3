"""Stop-RAG's Q-network training (arXiv:2510.14337 sec. 4.2, Algorithm 1; docs/methods/stoprag.md): Q(λ)
regression on the offline trajectories' states. Sample a batch of kept states, bootstrap from the current
network under no-grad over each state's future (:func:`rag_lab.policies.stoprag.targets.targets`), squared
error on both heads (BCE on the margin for the binary classifier). AdamW, cosine lr with warm-up; λ annealed
by step.

Resumable to the bit (``policy.py``'s module doc): a checkpoint every ``checkpoint_every`` steps
(:func:`save_atomic`) holds the heads (the encoder too when it trains), AdamW (under FSDP its state in
shards beside it, ``qnet_optimizer-<step>/``: torch's distributed checkpoint), the schedule, the step,
torch's RNG states (:func:`rng_state`: the heads' dropout), the log rows and the stats; the data order is a
pure function of the seed and the step (:func:`batches`), λ of the step. With a frozen encoder the states
are encoded once (:func:`encoded_states`, kept beside the offline data).

Data-parallel under ``launch`` (:func:`rag_lab.train.parallel.shared_backward`): each of N processes takes
every N-th state of each batch, its loss a sum over its states; the gradients are summed across the
processes (accelerate's ``reduce``) before the optimiser step, so N processes make the step of one (the
heads' dropout draws differ: the same update in distribution, and exactly with ``dropout=0``). The main
process writes the checkpoints and the log and measures the held-out curve; the frozen encoder's states are
encoded by all the processes, each a share of the passes (:func:`encoded_states`). Hand-written because
the loss bootstraps from the network's own forward passes on states outside the batch (a DDP wrapper syncs
one forward's gradients).

Hand-written: no RL library has the full-width forward-view Q(λ) of a two-action stopping MDP.
"""

import json
import logging
import math
import os
import random
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from rag_lab.core.records import atomic_write_text
from rag_lab.policies.stoprag.offline import Trajectory, states_of
from rag_lab.policies.stoprag.qnet import QNetwork
from rag_lab.policies.stoprag.targets import keep, lambda_at, targets
from rag_lab.train.heldout import rng_kept
from rag_lab.train.parallel import barrier, is_main, shared_backward, spread
from rag_lab.train.resume import load_torch
from rag_lab.train.sharded import (
    fsdp_launch,
    full_state_dict,
    load_sharded,
    save_sharded,
    sharded_backward,
)

log = logging.getLogger(__name__)
# a sharded run's optimizer state beside its checkpoint file: <out_dir>/<OPTIMIZER>-<step>/
OPTIMIZER = "qnet_optimizer"


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


def plain_data(value):
    """``value`` (stats, log rows) as JSON's types (a numpy number becomes a float), so that its file loads
    with ``weights_only=True``: a deep copy.

    >>> import numpy as np
    >>> plain_data({"tau": np.float64(0.5), "rows": [{"step": np.int64(2)}]})
    {'tau': 0.5, 'rows': [{'step': 2}]}
    """
    return json.loads(json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


def save_atomic(obj, path: Path) -> None:
    """``torch.save`` to a temporary file, then rename: a kill never leaves a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def encoded_states(qnet: QNetwork, inputs: list[list[tuple]], path: Path | None) -> torch.Tensor | None:
    """[N, T-1, d] the frozen encoder's pooled states ``inputs[i][t-1]``, loaded from ``path`` when it
    is there, else encoded (256 a pass) and saved there. Under a launch each process encodes every N-th pass
    and the passes are gathered (:func:`~rag_lab.train.parallel.spread`); each pass starts from an empty memo,
    so its encodings are a function of its states alone (an encoding differs in the last bit with the other
    states of its forward pass): N processes encode what one does, bit for bit."""
    device = qnet.stop_head[1].weight.device
    saved = load_torch(path, map_location=device) if path is not None else None
    if saved is not None:
        return saved
    flat = [s for row in inputs for s in row]
    if not flat:
        return None
    starts = range(0, len(flat), 256)

    def passes(units: list[int]) -> list[torch.Tensor]:
        out = []
        for u in tqdm(units, desc="encode states", unit="batch", disable=not is_main()):
            qnet.clear_cache()
            out.append(qnet.encode(flat[starts[u] : starts[u] + 256]).cpu())
        return out

    features = torch.cat(spread(len(starts), passes)).to(device).view(len(inputs), len(inputs[0]), -1)
    qnet.clear_cache()
    if path is not None and is_main():  # every process holds them; the main one writes the cache
        save_atomic(features, path)
    return features


class QLoss:
    """The loss of a batch of (trajectory, t) states of one training run of ``policy`` (a
    :class:`~rag_lab.policies.stoprag.policy.StopRAG`): the targets of ``policy.target`` at λ, bootstrapped
    from the network itself in eval mode, against its two heads."""

    def __init__(self, policy, trajs: list[Trajectory], features_path: Path | None):
        self.qnet = policy.qnet
        self.target = policy.target
        horizon = policy.pipeline.iterations
        self.device = policy.device
        rewards = torch.tensor([t.rewards for t in trajs], dtype=torch.float32)  # [N, T+1]
        mask = keep(rewards)
        self.rewards = rewards.to(self.device)
        order = list(range(len(trajs)))
        random.Random(policy.seed).shuffle(order)
        n_val = int(round(policy.val_fraction * len(trajs)))
        val_q, train_q = set(order[:n_val]), set(order[n_val:])
        pairs = [(i, t) for i in range(len(trajs)) for t in range(1, horizon) if mask[i, t]]
        self.train_pairs = [p for p in pairs if p[0] in train_q]
        self.val_pairs = [p for p in pairs if p[0] in val_q]
        self.states = {
            "all": len(trajs) * (horizon - 1),
            "kept": len(pairs),
            "train": len(self.train_pairs),
            "val": len(self.val_pairs),
        }
        self.inputs = [states_of(t, horizon - 1) for t in trajs]  # inputs[i][t-1] = s_t
        frozen = self.qnet.frozen
        self.features = encoded_states(self.qnet, self.inputs, features_path) if frozen else None
        self.qnet.clear_cache()  # held in `features`; a cached file or a resume never filled the memo
        # bf16 where supported (a GPU with bf16); CPU runs stay in float32
        self.amp = policy.bf16 and self.device.type == "cuda" and torch.cuda.is_bf16_supported()

    def q_values(self, rows: list[int], ts: list[int] | None = None):
        """Q at s_1..s_{T-1} of each row, padded to [rows, T+1] (no grad), or at (row, t) pairs (grad)."""
        qnet, features, inputs = self.qnet, self.features, self.inputs
        if ts is not None:
            if features is not None:
                return qnet(pooled=features[rows, [t - 1 for t in ts]])
            return qnet([inputs[r][t - 1] for r, t in zip(rows, ts, strict=True)])
        with torch.no_grad():
            if features is not None:
                s, c = qnet(pooled=features[rows].flatten(0, 1))
            else:
                s, c = qnet([st for r in rows for st in inputs[r]])
        pad = torch.zeros(len(rows), 1, device=self.device)
        return (
            torch.cat([pad, s.view(len(rows), -1), pad], 1),
            torch.cat([pad, c.view(len(rows), -1), pad], 1),
        )

    def __call__(
        self, batch: list[tuple[int, int]], lam: float, weights: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The summed loss of ``batch``'s states (each weighted by ``weights`` where given)."""
        rows, qnet = [i for i, _ in batch], self.qnet
        ts = torch.tensor([t for _, t in batch], device=self.device)
        bootstrap = self.target in ("qlambda", "q0")
        was = qnet.training
        qnet.eval()
        qs, qc = self.q_values(rows) if bootstrap else (None, None)
        qnet.train(was)
        stop_t, cont_t = targets(self.target, self.rewards[rows], ts, qs, qc, lam)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            stop, cont = self.q_values(rows, ts=ts.tolist())
        stop, cont = stop.float(), cont.float()
        if self.target == "binary":
            reduction = "sum" if weights is None else "none"
            losses = F.binary_cross_entropy_with_logits(stop - cont, cont_t, reduction=reduction)
        else:
            losses = (stop_t - stop) ** 2 + (cont_t - cont) ** 2
        return losses.sum() if weights is None else (losses * weights.to(losses.device)).sum()

    def validation(self, lam: float, batch_size: int) -> float:
        """The mean loss per validation state, in eval mode, in training-size chunks (a fine-tuned
        encoder's memory); the network goes back to training mode (its frozen encoder to eval)."""
        self.qnet.eval()
        with torch.no_grad():
            chunks = range(0, len(self.val_pairs), batch_size)
            total = sum(self(self.val_pairs[c : c + batch_size], lam).item() for c in chunks)
        training_mode(self.qnet)
        return total / len(self.val_pairs)


def training_mode(qnet: QNetwork) -> None:
    qnet.train()
    if qnet.frozen:
        qnet.encoder.eval()


def train_qnet(
    policy,
    trajs: list[Trajectory],
    out_dir: Path,
    features_path: Path | None,
    rng: dict | None,
    heldout: Callable[[QNetwork | None], dict] | None = None,
):
    """Train ``policy.qnet`` (a :class:`~rag_lab.policies.stoprag.policy.StopRAG`'s) on ``trajs`` (module
    docstring). Starts from torch's RNG state ``rng`` (:func:`rng_state`; None: the current one), or
    resumes exactly from ``out_dir/qnet_checkpoint.pt``. ``heldout(qnet)``: the held-out curve's values,
    on the start's row (step 0, no network: fixed T) and on each checkpoint's row."""
    from transformers import get_cosine_schedule_with_warmup

    qnet, loss_of = policy.qnet, QLoss(policy, trajs, features_path)  # the states encoded by every process
    policy.stats["states"] = loss_of.states
    params = [p for p in qnet.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=policy.lr, weight_decay=policy.weight_decay)
    per_epoch = max(1, math.ceil(len(loss_of.train_pairs) / policy.batch_size))
    total = max(1, math.ceil(policy.epochs * per_epoch))
    sched = get_cosine_schedule_with_warmup(opt, int(policy.warmup_ratio * total), total)
    ckpt, step, rows = out_dir / "qnet_checkpoint.pt", 0, []
    saved = resumed(policy, ckpt, opt, sched, total)
    if saved is not None:
        step, rows, rng = saved["step"], saved["log"], saved["rng"]
    accelerator, plain = shard(qnet, opt, saved, out_dir), None
    if rng is not None:
        set_rng_state(rng)
    main, log_path = is_main(), out_dir / "train_log.jsonl"
    if main:  # the main process measures and logs; the checkpoint's rows: none after it, none twice
        rows += [{"step": 0} | heldout(None)] if heldout is not None and not rows else []
        atomic_write_text(log_path, "".join(json.dumps(row) + "\n" for row in rows))
    bar = tqdm(total=total, initial=step, desc=f"Stop-RAG Q({policy.target})", unit="step", disable=not main)
    training_mode(qnet)
    for batch in batches(loss_of.train_pairs, policy.batch_size, policy.seed, step):
        if step >= total:
            break
        lam = lambda_at(step / total, *policy.lambdas)
        opt.zero_grad()
        if accelerator is None:
            loss = shared_backward(batch, lambda states, lam=lam: loss_of(states, lam), params)
        else:  # FSDP: the sharded network's step (every process makes the same passes)
            loss = sharded_backward(batch, lambda states, w, lam=lam: loss_of(states, lam, w), accelerator)
        opt.step()
        sched.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item() / policy.batch_size:.4f}", lam=f"{lam:.2f}")
        if step % policy.checkpoint_every and step != total:
            continue
        if accelerator is None:
            net, optimizer = qnet, {"optimizer": opt.state_dict()} if main else None
        else:  # every process: the full weights into an unsharded copy, the optimizer's state in shards
            net = plain = unsharded(policy, qnet, plain)
            optimizer = {"sharded_optimizer": sharded_optimizer(qnet, opt, out_dir, step)}
        if main:  # the main process measures, logs and saves (the unsharded copy's weights)
            row = {
                "step": step,
                "loss": loss.item() / len(batch),
                "lambda": lam,
                "lr": sched.get_last_lr()[0],
            }
            policy.qnet = loss_of.qnet = net
            rows.append(checkpoint_row(policy, loss_of, row, heldout))
            state = {"model": policy.trainable_state(), **optimizer, "scheduler": sched.state_dict()}
            state |= {"step": step, "rng": rng_state(), "log": plain_data(rows)}
            save_atomic(state | {"stats": plain_data(policy.stats)}, ckpt)
            with log_path.open("a") as f:
                f.write(json.dumps(rows[-1]) + "\n")
            policy.qnet = loss_of.qnet = qnet
            if accelerator is not None:  # the optimizer's older shards, once the checkpoint names the new
                for old in out_dir.glob(f"{OPTIMIZER}-*"):
                    if old.name != optimizer["sharded_optimizer"]:
                        shutil.rmtree(old, ignore_errors=True)
    bar.close()
    if accelerator is not None:  # what follows (τ, saving, evaluating) runs on the trained unsharded copy
        policy.qnet = unsharded(policy, qnet, plain)
    policy.qnet.eval()


def resumed(policy, ckpt: Path, opt, sched, total: int) -> dict | None:
    """The checkpoint at ``ckpt`` loaded into ``policy.qnet``, ``opt`` (an unsharded run's) and ``sched``
    (None: none, or one that predates exact resumption)."""
    saved = load_torch(ckpt, map_location=policy.device)
    if saved is not None and "rng" not in saved:
        log.warning("Stop-RAG: %s predates exact resumption; training from step 0", ckpt)
        return None
    if saved is not None:
        policy.qnet.load_state_dict(saved["model"], strict=False)
        if "optimizer" in saved:  # an unsharded run's; a sharded one's loads after prepare (shard)
            opt.load_state_dict(saved["optimizer"])
        sched.load_state_dict(saved["scheduler"])
        policy.stats.update(saved["stats"])
        log.info("Stop-RAG: resuming Q-network training at step %d / %d", saved["step"], total)
    return saved


def checkpoint_row(policy, loss_of: QLoss, row: dict, heldout) -> dict:
    """A checkpoint's log row: ``row`` with the validation loss and the held-out curve's values, measured
    on ``policy.qnet`` (kept in training mode), also kept as ``policy.stats["train"]``."""
    if loss_of.val_pairs:
        row["val_loss"] = loss_of.validation(row["lambda"], policy.batch_size)
    if heldout is not None:
        with rng_kept():
            row |= heldout(policy.qnet)
        training_mode(policy.qnet)
    policy.stats["train"] = row
    return row


def shard(qnet: QNetwork, opt, saved: dict | None, out_dir: Path):
    """Under an FSDP launch: the Q-network and its optimizer prepared by accelerate (FSDP2 shards them in
    place); the accelerator (None: not sharded). A checkpoint written by sharded processes has its optimizer
    state loaded, sharded or not, in any number of processes (torch's distributed checkpoint reshards it)."""
    accelerator = None
    if fsdp_launch():
        from accelerate import Accelerator

        accelerator = Accelerator()
        plugin = accelerator.state.fsdp_plugin
        named = plugin.transformer_cls_names_to_wrap
        plugin.transformer_cls_names_to_wrap = qnet._no_split_modules  # its encoder's layers, not an LM's
        try:
            accelerator.prepare(qnet, opt)
        finally:
            plugin.transformer_cls_names_to_wrap = named
    if saved is not None and "sharded_optimizer" in saved:
        load_sharded(out_dir / saved["sharded_optimizer"], qnet, opt, weights=False)
    return accelerator


def sharded_optimizer(qnet, opt, out_dir: Path, step: int) -> str:
    """The sharded optimizer's state at ``step`` written by every process (its own shards: torch's
    distributed checkpoint, a collective) into ``out_dir/<OPTIMIZER>-<step>``; that folder's name, which
    the checkpoint file then names."""
    name = f"{OPTIMIZER}-{step}"
    if is_main():
        shutil.rmtree(out_dir / name, ignore_errors=True)  # a kill's half-written one
    barrier()
    save_sharded(out_dir / name, qnet, opt, weights=False)
    return name


def unsharded(policy, qnet, plain: QNetwork | None) -> QNetwork:
    """An unsharded Q-network (``plain``, or a new one) holding the sharded ``qnet``'s full weights: every
    process calls it (a collective)."""
    weights = full_state_dict(qnet, everywhere=True)
    if plain is None:
        plain = QNetwork(**policy.qnet_args).to(policy.device)
    plain.load_state_dict(weights)
    training_mode(plain)
    return plain
