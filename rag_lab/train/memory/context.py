"""What a method's plan reads of the run: its config, the launch's bench, the run's model, its generator (the
rollouts' engine) and the encoders it puts on the GPU.

Encoders on a GPU: every ``rag_lab.retrievers.dense.Encoder`` node of the config (the retriever's, the
rewards') and the reranker (``CrossEncoderReranker``), each in float32 (``from_pretrained``'s dtype) unless
its ``device`` is ``cpu``, its forward over one batch of its ``batch_size`` texts of ``max_length`` tokens
during rollouts; a method may add its own (EVO-RAG's preference encoder). A dense index on a GPU
(``retriever.index_device``) is refused under a launch of several processes a node (one copy a process), and
is not planned. ``retriever=remote`` holds nothing on the training GPUs.
"""

import functools
from dataclasses import dataclass, field

import torch

from rag_lab.core.errors import RagLabError
from rag_lab.train.memory import fake
from rag_lab.train.memory.architectures import model_config
from rag_lab.train.memory.measure import tracking
from rag_lab.train.memory.phases import Bench, Rollout, tokens
from rag_lab.train.memory.settings import MemorySettings

ENCODER = "rag_lab.retrievers.dense.Encoder"
# the packaged GGUF of generator=smollm2 quantizes this hub model (its architecture ships here)
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
RERANKER = "rag_lab.retrievers.rerank.CrossEncoderReranker"
# an Encoder built from a name alone (EVO-RAG's preference encoder): its defaults
ENCODER_DEFAULTS = {"batch_size": 64, "max_length": 256}


@dataclass
class Context:
    cfg: dict
    memory: MemorySettings
    world: int
    bench: Bench
    _encoders: dict = field(default_factory=dict)

    def model_name(self) -> tuple[str, str]:
        """(the run's model: a folder or a hub name, the key that names it)."""
        gen = self.generator
        target = str(gen.get("_target_", ""))
        if gen.get("model"):
            return str(gen["model"]), "generator.model"
        if target.endswith("tiny.generator.tiny_lm"):
            from rag_lab.train.tiny.generator import checkpoint_dir

            return str(checkpoint_dir(gen.get("checkpoint"))), "generator.checkpoint"
        if target.endswith("smollm2.smollm2"):
            return SMOLLM2, "generator"
        raise RagLabError(f"generator: {target or 'null'} names no model whose memory the plan can build")

    @functools.cached_property
    def model(self):
        """The run's model's architecture (transformers' config)."""
        return model_config(*self.model_name())

    @property
    def positions(self) -> int:
        return int(getattr(self.model, "max_position_embeddings", 0) or 2**31)

    @property
    def generator(self) -> dict:
        return self.cfg.get("generator") or {}

    @property
    def vllm(self) -> bool:
        """Whether the rollouts generate on vLLM (``generator=vllm``: its node has ``train_memory``)."""
        return "train_memory" in self.generator

    def share(self, n: int, key: str) -> int:
        """This process's share of a global batch ``n`` (``key``)."""
        if n % self.world:
            raise RagLabError(
                f"{key}={n} does not split over {self.world} processes (each takes an equal share)"
            )
        return n // self.world

    def architecture(self, name: str, key: str):
        return model_config(name, key)

    def rollout(self, rows: int, length: int, trains: bool = True, extra=()) -> Rollout:
        """The rollouts of a trainer: ``rows`` sequences of ``length`` tokens a process (HF generate: one call
        of at most ``generator.batch_size`` of them), on the run's generator; ``trains=False``: a trainer that
        does not roll out (SFT); ``extra``: encoders a method adds, (key, model name) pairs."""
        weights, forward = self.encoders(tuple(extra))
        if not trains:
            return Rollout(encoders=weights)
        gen, notes = self.generator, []
        if self.vllm:
            if gen.get("train_mode") == "server":
                notes.append("vLLM serves on GPUs of its own (generator.train_mode: server)")
                return Rollout(syncs=True, length=length, encoders=weights, encoding=forward, notes=notes)
            engine = int(gen["train_memory"] * self.memory.gpu_bytes)
            asleep = bool(gen.get("sleep", False))
            return Rollout(engine, asleep, syncs=True, length=length, encoders=weights, encoding=forward)
        hf_rows = min(int(gen.get("batch_size") or rows), rows)
        return Rollout(hf_rows=hf_rows, length=length, encoders=weights, encoding=forward)

    def black_box(self) -> Rollout:
        """The run's generator as a black box beside training (Stop-RAG's): vLLM's engine at its
        ``gpu_memory_utilization``, never asleep; or the HF model's weights."""
        weights, forward = self.encoders(())
        gen = self.generator
        if self.vllm:
            engine = int(gen.get("gpu_memory_utilization", 0.9) * self.memory.gpu_bytes)
            note = f"the run's vLLM engine at gpu_memory_utilization {gen.get('gpu_memory_utilization')}"
            return Rollout(engine, encoders=weights, encoding=forward, notes=[note])
        try:
            config = self.model
        except RagLabError:  # a teacher, an API model: nothing on this GPU
            note = f"the run's generator ({gen.get('_target_', 'none')}) holds no GPU memory"
            return Rollout(encoders=weights, encoding=forward, notes=[note])
        lm = fake.materialize(fake.causal_lm(config, self.bench.dtype, trains=False))
        note = "the run's HF generator, whole"
        return Rollout(fake.module_bytes(lm), encoders=weights, encoding=forward, notes=[note])

    def encoders(self, extra: tuple = ()) -> tuple[int, int]:
        """(the encoders' weights on the GPU, the largest of their forwards' transients): module
        docstring."""
        if extra not in self._encoders:
            self._encoders[extra] = self._measure_encoders(extra)
        return self._encoders[extra]

    def _measure_encoders(self, extra: tuple) -> tuple[int, int]:
        found = [
            (path, node) for path, node in _nodes(self.cfg, "") if node.get("_target_") in (ENCODER, RERANKER)
        ]
        found += [(key, {"model": name, **ENCODER_DEFAULTS}) for key, name in extra if name]
        weights, transient = 0, 0
        for path, node in found:
            if str(node.get("device") or "").startswith("cpu"):
                continue
            config = model_config(str(node["model"]), f"{path}.model")
            rows, length = int(node.get("batch_size") or 32), int(node.get("max_length") or 512)
            w, t = encoder_bytes(config, rows, length, node.get("_target_") == RERANKER)
            weights, transient = weights + w, max(transient, t)
        return weights, transient


def encoder_bytes(config, rows: int, length: int, classifier: bool = False) -> tuple[int, int]:
    """(an encoder's float32 weights, its no-gradient forward's peak over them), on fake weights
    (MemTracker)."""
    model = fake.materialize(fake.encoder(config, classifier=classifier))
    weights = fake.module_bytes(model)
    length = min(length, int(getattr(config, "max_position_embeddings", length) or length))
    with tracking(model) as phase, torch.no_grad():
        model(input_ids=tokens(rows, length, config.vocab_size))
    return weights, max(0, sum(phase.lines().values()) - weights)


def _nodes(node, path: str):
    """Every mapping of ``node`` with its dotted path."""
    if isinstance(node, dict):
        yield path or "<root>", node
        for key, value in node.items():
            yield from _nodes(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _nodes(item, f"{path}[{i}]")
