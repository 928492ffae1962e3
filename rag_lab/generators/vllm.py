"""``generator=vllm``: the same interface on vLLM's offline engine (GPU machines; ``make install-gpu``).

vLLM is imported when this backend is built, so the package imports without it; when it is
missing the error says how to install it. The engine itself is built when it first generates, so that a
method that trains first (DAPO) can hold the GPU for its trainer and TRL's own engine. Chat prompts go
through the model's chat template, stop strings through vLLM's own (``include_stop_str_in_output`` for
``include_stop``), and the log-prob of each sampled token comes back with ``logprobs=0``.

Training with ``generator=vllm`` (issue 50): a method trains a transformers copy of ``model``
(:meth:`VLLMGenerator.trainable`), and its GRPO trainer runs with TRL's vLLM integration
(:meth:`VLLMGenerator.trl_settings`: ``use_vllm``, ``colocate`` or ``server``): TRL pushes the trained
weights into its engine after every update, before the next rollouts, and DAPO's multi-turn rollouts
generate through that engine (:func:`engine_generator`). After training, the run evaluates with an engine
on the trained weights (:meth:`VLLMGenerator.with_weights`).

Hand-written: only the adapters between our ``generate(prompts, sampling)`` and vLLM's engine / TRL's
vLLM client. The weight sync (DeepSpeed / FSDP gathering included) is TRL's. The tests run the seam with a
fake engine in place of vLLM's (no GPU there); the real engine is checked on a GPU machine.
"""

import copy
from collections.abc import Sequence
from typing import Annotated, Any

from rag_lab.batches import colocated_engine
from rag_lab.errors import RagLabError
from rag_lab.generators.base import Completion, Prompt, Sampling, cut_at_stop, render
from rag_lab.ranges import OneOf, OpenUnit, PositiveInt


def _vllm():
    try:
        import vllm
    except ImportError:
        raise RagLabError(
            "generator=vllm needs vLLM: `make install-gpu` (pip install 'rag_lab[gpu]') on a CUDA machine"
        ) from None
    return vllm


class VLLMGenerator:
    # a colocated engine's tensor-parallel group splits the training ranks (rag_lab.batches)
    check_settings = staticmethod(colocated_engine)

    def __init__(
        self,
        model: str,
        tensor_parallel_size: PositiveInt = 1,
        dtype: str = "auto",
        gpu_memory_utilization: OpenUnit = 0.85,
        max_model_len: PositiveInt | None = None,
        seed: int = 0,
        logprobs: bool = True,
        # prompts as chat messages (instruction-tuned models)
        chat: bool = True,
        # the tokenizer's folder or hub name (null: the model's)
        tokenizer: str | None = None,
        # a trained method's rollouts: TRL's engine in the trainer's process ("colocate", taking
        # train_memory of each GPU) or a `trl vllm-serve` server at server_url ("server")
        train_mode: Annotated[str, OneOf("colocate", "server")] = "colocate",
        train_memory: OpenUnit = 0.3,
        server_url: str | None = None,
    ):
        self._vllm = _vllm()
        self.model_name, self.tokenizer_name = model, tokenizer or model
        self.tensor_parallel_size, self.dtype, self.max_model_len = tensor_parallel_size, dtype, max_model_len
        self.gpu_memory_utilization, self.seed = gpu_memory_utilization, seed
        self.want_logprobs, self.chat = logprobs, chat
        self.train_mode, self.train_memory, self.server_url = train_mode, train_memory, server_url
        self._llm, self._tokenizer = None, None

    @classmethod
    def around(cls, llm, tokenizer, chat: bool, seed: int = 0, logprobs: bool = True) -> "VLLMGenerator":
        """A generator on an engine someone else holds (TRL's colocated one, whose weights it syncs)."""
        self = cls.__new__(cls)
        self._vllm, self._llm, self._tokenizer = _vllm(), llm, tokenizer
        self.model_name = self.tokenizer_name = getattr(tokenizer, "name_or_path", "")
        self.seed, self.want_logprobs, self.chat = seed, logprobs, chat
        return self

    @property
    def llm(self):
        if self._llm is None:
            self._llm = self._vllm.LLM(
                model=self.model_name,
                tokenizer=self.tokenizer_name,
                tensor_parallel_size=self.tensor_parallel_size,
                dtype=self.dtype,
                seed=self.seed,
                gpu_memory_utilization=self.gpu_memory_utilization,
                max_model_len=self.max_model_len,
            )
        return self._llm

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_name)
        return self._tokenizer

    @property
    def context_length(self) -> int:
        """The most tokens the engine reads (prompts are fitted to it: rag_lab.env.fit)."""
        return self.llm.llm_engine.model_config.max_model_len

    def with_weights(self, path: str) -> "VLLMGenerator":
        """These settings on other weights (a trained model's folder), with this tokenizer; its engine is
        built when it first generates."""
        other = copy.copy(self)
        other.model_name, other._llm = str(path), None
        return other

    def trainable(self):
        """A transformers generator on the same weights and tokenizer: what a trained method updates."""
        from rag_lab.generators.hf import HFGenerator

        return HFGenerator(self.model_name, self.tokenizer_name, seed=self.seed, chat=self.chat)

    def trl_settings(self) -> dict[str, Any]:
        """TRL's ``GRPOConfig`` keys that roll out through vLLM and sync the trained weights into it."""
        settings = {
            "use_vllm": True,
            "vllm_mode": self.train_mode,
            "vllm_tensor_parallel_size": self.tensor_parallel_size,
            "vllm_gpu_memory_utilization": self.train_memory,
            "vllm_max_model_length": self.max_model_len,
        }
        if self.train_mode == "server":
            if not self.server_url:
                raise RagLabError(
                    "generator.server_url: train_mode=server needs the `trl vllm-serve` address"
                )
            settings["vllm_server_base_url"] = self.server_url
        return settings

    def params(self, sampling: Sampling):
        return self._vllm.SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p if sampling.temperature > 0 else 1.0,
            max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=sampling.include_stop,
            seed=self.seed if sampling.seed is None else sampling.seed,
            logprobs=0 if self.want_logprobs else None,
        )

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[list[Completion]]:
        texts = [render(self.tokenizer, p) for p in prompts]
        outputs = self.llm.generate(texts, self.params(sampling), use_tqdm=False)
        return [[self._completion(o) for o in out.outputs] for out in outputs]

    @staticmethod
    def _completion(o) -> Completion:
        logprobs = None
        if o.logprobs is not None:
            logprobs = [step[token].logprob for step, token in zip(o.logprobs, o.token_ids, strict=True)]
        finish = "length" if o.finish_reason == "length" else "stop"
        return Completion(o.text, list(o.token_ids), finish, logprobs)


class VLLMServerGenerator:
    """``generate`` through TRL's ``VLLMClient`` (a ``trl vllm-serve`` server, whose weights TRL syncs); stop
    strings go in vLLM's request as ``stop``, and the text is cut at the first one as the engine does."""

    def __init__(self, client, tokenizer, chat: bool, seed: int = 0):
        self.client, self.tokenizer, self.chat, self.seed = client, tokenizer, chat, seed

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[list[Completion]]:
        texts = [render(self.tokenizer, p) for p in prompts]
        stop = list(sampling.stop)
        out = self.client.generate(
            prompts=texts,
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p if sampling.temperature > 0 else 1.0,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,
            generation_kwargs={
                "stop": stop or None,
                "include_stop_str_in_output": sampling.include_stop,
                "seed": self.seed if sampling.seed is None else sampling.seed,
            },
        )
        completions = []
        for ids, logprobs in zip(out["completion_ids"], out["logprobs"], strict=True):
            text, end = cut_at_stop(self.tokenizer.decode(ids, skip_special_tokens=True), sampling)
            finish = "length" if end is None and len(ids) >= sampling.max_new_tokens else "stop"
            completions.append(Completion(text, list(ids), finish, [step[0] for step in logprobs]))
        return [completions[i * sampling.n : (i + 1) * sampling.n] for i in range(len(texts))]


def engine_generator(vllm_generation, tokenizer, chat: bool, seed: int = 0):
    """Our generator on TRL's vLLM backend (``trainer.vllm_generation``): its colocated engine, or its
    server's client (a process without one opens its own, for generation only)."""
    if vllm_generation.mode == "colocate":
        return VLLMGenerator.around(vllm_generation.llm, tokenizer, chat, seed)
    client = getattr(vllm_generation, "vllm_client", None)
    if client is None:
        from trl.generation.vllm_client import VLLMClient

        client = VLLMClient(base_url=vllm_generation.server_base_url)
    return VLLMServerGenerator(client, tokenizer, chat, seed)
