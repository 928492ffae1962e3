"""``generator=hf``: any causal LM through transformers, batched.

Prompts are decoded in batches of ``batch_size`` (sorted by length) by
:func:`rag_lab.generators.decode.decode`: prefilled in length buckets, then one decoding batch that
finished rows leave; n samples per prompt from one reading of it. Chat prompts go through the
tokenizer's chat template; a prompt given as token ids (:class:`~rag_lab.generators.base.TokenPrompt`: a
multi-turn rollout's history) is decoded from those ids as they are. Stop strings are honoured exactly:
a row stops once its decoded completion holds one (decoded whole, so word-level tokenizers such as the
tiny LM's work too) and the text is cut at the first occurrence, the stop kept when
``sampling.include_stop``; ``token_ids`` run through the token that completes the stop.
Log-probs are those of each generated token under the model's own distribution (log-softmax of
the raw logits, no temperature or top-p), i.e. what a forward pass over prompt + completion gives.
Greedy at temperature 0; sampling is seeded (``sampling.seed``, else the generator's seed).

``device="auto"`` runs a model where it is fastest (:func:`default_device`): on a GPU when there is one,
except a model under :data:`GPU_MIN_PARAMETERS`, which a GPU runs slower than the CPU (every kernel launch
costs more than its arithmetic; ``experiments/bench_device.py``): the tiny LM stays on the CPU. The
trainers train a model on the device this rule gives it.
"""

import copy
import re
from collections.abc import Sequence

import torch

from rag_lab.core.devices import local_gpu
from rag_lab.core.errors import RagLabError
from rag_lab.core.loading import replicated_loading
from rag_lab.core.ranges import PositiveInt
from rag_lab.generators.base import Completion, Prompt, Sampling, TokenPrompt, cut_at_stop, prompt_ids
from rag_lab.generators.decode import Decoded, decode
from rag_lab.retrievers.dense import resolve_model

# Below this many parameters a causal LM is launch-bound on a GPU: the tiny LM (0.3M) generates and trains
# faster on the CPU, SmolLM2 (135M) far faster on a GPU (experiments/results/bench_device.md).
GPU_MIN_PARAMETERS = 20_000_000
# Tokens beyond a stop string's length decoded when looking for it (tokens that decode to nothing).
STOP_MARGIN = 8


def default_device(model) -> str:
    """Where ``model`` runs fastest: this process's GPU (:func:`rag_lab.core.devices.local_gpu`:
    ``cuda:<LOCAL_RANK>`` in a launched process) when there is one and the model is not small, else
    ``cpu``."""
    # ZeRO-3's init leaves 1/N of each weight in a process: its whole size is ds_numel
    size = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    if not torch.cuda.is_available() or size < GPU_MIN_PARAMETERS:
        return "cpu"
    return local_gpu()


class HFGenerator:
    def __init__(
        self,
        # a hub name (in the local HF cache: nothing is downloaded offline) or a local model directory
        model: str,
        # where the tokenizer comes from, the same kinds of name (null: the model's own)
        tokenizer: str | None = None,
        # float32 | bfloat16 | float16 | auto (bfloat16 on GPU, float32 on CPU)
        dtype: str = "auto",
        # auto (default_device: a GPU when there is one, unless the model is small) | cpu | cuda | cuda:N
        device: str = "auto",
        # prompts decoded together (sorted by length)
        batch_size: PositiveInt = 32,
        # seeds sampling when the caller's sampling gives no seed of its own
        seed: int = 0,
        # return per-token log-probs (trainable policies need them; costs memory for long outputs)
        logprobs: bool = True,
        # prompts as chat messages (null: when the tokenizer has a chat template)
        chat: bool | None = None,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model(model)
        where = resolve_model(tokenizer) if tokenizer else path
        self.source = path  # the model's folder: its fingerprint (rag_lab.runner.rundir.lm_fingerprint)
        self.tokenizer = AutoTokenizer.from_pretrained(where)
        if not self.tokenizer("Where was Ada born?", add_special_tokens=False).input_ids:
            # transformers builds an empty tokenizer from a model folder without tokenizer files
            key = "generator.tokenizer" if tokenizer else "generator.model"
            raise RagLabError(
                f"{key}: {where} holds no tokenizer (text encodes to no tokens); "
                "set generator.tokenizer to a folder or hub name that has one"
            )
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        load_dtype = getattr(torch, _loaded_dtype(dtype, device))
        with replicated_loading():  # frozen: the whole model in every process of a sharded launch
            loaded = AutoModelForCausalLM.from_pretrained(path, dtype=load_dtype)
        # a bare "cuda" is this process's GPU (each rank its own), as "auto" picks it
        self.device = (
            default_device(loaded)
            if device in ("auto", None)
            else local_gpu()
            if device == "cuda"
            else device
        )
        if dtype == "auto" and self.device.startswith("cuda"):
            loaded = loaded.to(torch.bfloat16)
        self.model = loaded.to(self.device).eval()
        self.dtype = self.model.dtype  # what release() reloads it in
        self.batch_size = batch_size
        self.seed = seed
        self.want_logprobs = logprobs
        # Policies render chat messages for tokenizers with a chat template, plain text otherwise.
        self.chat = bool(self.tokenizer.chat_template) if chat is None else chat
        # the most tokens the model reads (prompts are fitted to it: rag_lab.env.fit)
        self.context_length = getattr(loaded.config, "max_position_embeddings", None)

    @staticmethod
    def check_settings(s: dict, run) -> list[tuple[str, str]]:
        """The dtype and the device, as names torch knows (:mod:`rag_lab.core.config`)."""
        problems = []
        if s["dtype"] not in ("auto", "float32", "bfloat16", "float16"):
            problems.append(("dtype", f"{s['dtype']!r} is not auto, float32, bfloat16 or float16"))
        device = str(s["device"])
        if not (device in ("auto", "None", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", device)):
            problems.append(("device", f"{device!r} is not auto, cpu, cuda or cuda:N"))
        return problems

    @property
    def model(self):
        """The causal LM, loaded again from ``source`` (on its device, in its dtype) if :meth:`release` let it
        go."""
        if self._model is None:
            from transformers import AutoModelForCausalLM

            with replicated_loading():
                loaded = AutoModelForCausalLM.from_pretrained(self.source, dtype=self.dtype)
            self._model = loaded.to(self.device).eval()
        return self._model

    @model.setter
    def model(self, model) -> None:
        self._model = model

    def release(self) -> None:
        """Lets the model go (its memory freed, the GPU's cache emptied): a trained method trains a copy of
        its own, and this generator reloads the same weights only if it is asked to generate again
        (:func:`rag_lab.train.start.starting_model`)."""
        import gc

        self._model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def with_model(self, model) -> "HFGenerator":
        """This generator's tokenizer and settings around another model (a trainer's live one, a trained
        one): a new generator, this one unchanged."""
        other = copy.copy(self)
        other.model = model
        return other

    def generate(self, prompts: Sequence[Prompt | TokenPrompt], sampling: Sampling) -> list[list[Completion]]:
        ids = prompt_ids(self.tokenizer, prompts)  # a TokenPrompt's ids as given
        # longest first, so that each decoding batch holds prompts of similar length
        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
        out: list[list[Completion]] = [[] for _ in ids]
        torch.manual_seed(self.seed if sampling.seed is None else sampling.seed)
        for start in range(0, len(order), self.batch_size):
            idx = order[start : start + self.batch_size]
            rows = self._decode([ids[i] for i in idx], sampling)
            for k, i in enumerate(idx):
                out[i] = [
                    self._completion(d, sampling, len(ids[i]))
                    for d in rows[k * sampling.n : (k + 1) * sampling.n]
                ]
        return out

    @torch.inference_mode()
    def _decode(self, prompts: list[list[int]], sampling: Sampling) -> list[Decoded]:
        stops = tuple(sampling.stop)
        # A stop string first appears with the token that completes it, so it lies within the last
        # len(stop) tokens (each decodes to at least a character; the margin covers empty ones): only
        # that tail is decoded, all rows in one call.
        tail = max((len(s) for s in stops), default=0) + STOP_MARGIN

        def stopped(rows: list[list[int]]) -> list[bool]:
            texts = self.tokenizer.batch_decode([r[-tail:] for r in rows], skip_special_tokens=True)
            return [any(s in text for s in stops) for text in texts]

        return decode(
            self.model,
            prompts,
            sampling,
            pad_id=self.tokenizer.pad_token_id,
            end_ids=self._end_ids(),
            stopped=stopped if stops else None,
            logprobs=self.want_logprobs,
        )

    def _end_ids(self) -> set[int]:
        """The tokens that end a completion: the tokenizer's EOS and padding, the model's EOS tokens."""
        configured = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        configured = configured if isinstance(configured, list) else [configured]
        return {self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, *configured} - {None}

    def _completion(self, decoded: Decoded, sampling: Sampling, prompt_tokens: int) -> Completion:
        tokens = decoded.tokens
        ended = bool(tokens) and tokens[-1] in self._end_ids()
        finish = "stop" if ended else "length"
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)  # the end token stays in tokens
        text, through = cut_at_stop(text, sampling)
        if through is not None:
            tokens = tokens[: _tokens_to_cover(self.tokenizer, tokens, through)]
            finish = "stop"
        lp = decoded.logprobs[: len(tokens)] if decoded.logprobs is not None else None
        return Completion(text, tokens, finish, lp, prompt_tokens=prompt_tokens)


def _loaded_dtype(dtype: str, device: str | None) -> str:
    """The dtype to load in: ``dtype``, or for ``auto`` float32 unless the device is a GPU already chosen
    (``auto`` devices are chosen after loading, by the model's size; a GPU then casts to bfloat16)."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if device not in ("auto", None) and device.startswith("cuda") else "float32"


def _tokens_to_cover(tokenizer, tokens: list[int], n_chars: int) -> int:
    """The fewest leading tokens whose decoded text is at least ``n_chars`` long."""
    for n in range(1, len(tokens) + 1):
        if len(tokenizer.decode(tokens[:n], skip_special_tokens=True)) >= n_chars:
            return n
    return len(tokens)
