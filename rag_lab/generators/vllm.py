"""``generator=vllm``: the same interface on vLLM's offline engine (GPU machines; ``make install-gpu``).

vLLM is imported when this backend is built, so the package imports without it; when it is
missing the error says how to install it. The engine itself is built when it first generates, so that a
method that trains first (DAPO) can hold the GPU for its trainer and TRL's own engine. Prompts reach every
engine as token ids (vLLM's ``TokensPrompt``, the server's ``prompt`` as ids, TRL's ``VLLMGeneration``, which
takes ids): a :class:`~rag_lab.generators.base.TokenPrompt`'s as given, a chat prompt through the model's
chat template and then tokenized with no special tokens added, as ``generator=hf`` does. Stop strings go
through vLLM's own (``include_stop_str_in_output`` for ``include_stop``), and the log-prob of each sampled
token comes back with ``logprobs=0``.

Training with ``generator=vllm`` (issue 50): a method trains a transformers copy of ``model``
(:meth:`VLLMGenerator.trainable`), and its GRPO trainer runs with TRL's vLLM integration
(:meth:`VLLMGenerator.trl_settings`: ``use_vllm``, ``colocate`` or ``server``): TRL pushes the trained
weights into its engine after every update, before the next rollouts, and DAPO's multi-turn rollouts and
the held-out curves of DAPO and APEX generate through that engine (:func:`engine_generator`,
:func:`rag_lab.train.lockstep.acting`). With ``sleep`` the colocated engine sleeps between those phases
(:func:`rag_lab.train.vllm_engine.awake`). After training, the run evaluates with an engine on the trained
weights (:meth:`VLLMGenerator.with_weights`).

The methods whose loops TRL does not run (R3-RAG's PPO, EVO-RAG's cycles) build TRL's vLLM backend themselves
(:mod:`rag_lab.train.vllm_engine`, from :meth:`VLLMGenerator.backend_settings`) and generate through the same
adapters (:func:`engine_generator`): each process on its own colocated engine (tensor parallelism 1) or its
own client of the server; with tensor parallelism > 1 in colocate mode the ranks of a TP group share one
engine and generate through TRL's ``VLLMGeneration.generate``, which gathers the group's prompts
(:class:`TPGroupGenerator`).

Hand-written: only the adapters between our ``generate(prompts, sampling)`` and vLLM's engine / TRL's
vLLM client / TRL's ``VLLMGeneration.generate``. The weight sync (DeepSpeed / FSDP gathering, LoRA merge
included) and the TP group's prompt gather are TRL's. The tests run the seam with a
fake engine in place of vLLM's (no GPU there); the real engine is checked on a GPU machine.
"""

import copy
from collections.abc import Sequence
from typing import Annotated, Any

from rag_lab.core.batches import colocated_engine
from rag_lab.core.errors import RagLabError
from rag_lab.core.ranges import OneOf, OpenUnit, PositiveInt
from rag_lab.generators.base import Completion, Prompt, Sampling, TokenPrompt, cut_at_stop, prompt_ids


def _vllm():
    try:
        import vllm
    except ImportError:
        raise RagLabError(
            "generator=vllm needs vLLM: `make install-gpu` (pip install 'rag_lab[gpu]') on a CUDA machine"
        ) from None
    return vllm


class VLLMGenerator:
    # a colocated engine's tensor-parallel group splits the training ranks (rag_lab.core.batches)
    check_settings = staticmethod(colocated_engine)

    def __init__(
        self,
        # a hub name or a local model directory, as vLLM loads it
        model: str,
        # GPUs one engine splits the model over
        tensor_parallel_size: PositiveInt = 1,
        # vLLM's weight dtype: auto (the model config's; float32 models in float16) | bfloat16 | float16 | ...
        dtype: str = "auto",
        # the share of each GPU's memory the engine takes (weights and KV cache)
        gpu_memory_utilization: OpenUnit = 0.85,
        # the longest prompt + completion in tokens (null: the model config's context length)
        max_model_len: PositiveInt | None = None,
        # seeds the engine, and sampling when the caller's sampling gives no seed of its own
        seed: int = 0,
        # return the sampled tokens' log-probs (trainable policies need them)
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
        # colocate mode: between rollout phases the engine gives training its GPU memory back (vLLM's
        # level-2 sleep: weights and KV cache dropped, the trained weights pushed again on waking; TRL's
        # vllm_enable_sleep_mode)
        sleep: bool = False,
    ):
        self._vllm = _vllm()
        self.model_name = model
        self.tokenizer_name = tokenizer or model
        self.tensor_parallel_size = tensor_parallel_size
        self.dtype = dtype
        self.max_model_len = max_model_len
        self.gpu_memory_utilization = gpu_memory_utilization
        self.seed = seed
        self.want_logprobs = logprobs
        self.chat = chat
        self.train_mode = train_mode
        self.train_memory = train_memory
        self.server_url = server_url
        self.sleep = sleep
        self._llm = None
        self._tokenizer = None

    @classmethod
    def around(cls, llm, tokenizer, chat: bool, seed: int = 0, logprobs: bool = True) -> "VLLMGenerator":
        """A generator on an engine someone else holds (TRL's colocated one, whose weights it syncs)."""
        self = cls.__new__(cls)
        self._vllm = _vllm()
        self._llm = llm
        self._tokenizer = tokenizer
        self.model_name = self.tokenizer_name = getattr(tokenizer, "name_or_path", "")
        self.seed = seed
        self.want_logprobs = logprobs
        self.chat = chat
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
        other.model_name = str(path)
        other._llm = None
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
            "vllm_enable_sleep_mode": self.sleep,
        }
        if self.train_mode == "server":
            if not self.server_url:
                raise RagLabError(
                    "generator.server_url: train_mode=server needs the `trl vllm-serve` address"
                )
            settings["vllm_server_base_url"] = self.server_url
        return settings

    def backend_settings(self) -> dict[str, Any]:
        """The same settings as keys of TRL's ``VLLMGeneration`` (a loop TRL does not run builds it:
        :mod:`rag_lab.train.vllm_engine`)."""
        s = self.trl_settings()
        return {
            "mode": s["vllm_mode"],
            "server_base_url": s.get("vllm_server_base_url"),
            "tensor_parallel_size": s["vllm_tensor_parallel_size"],
            "gpu_memory_utilization": s["vllm_gpu_memory_utilization"],
            "max_model_length": s["vllm_max_model_length"],
            "enable_sleep_mode": s["vllm_enable_sleep_mode"],
            "logprobs": 0,
        }

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

    def generate(self, prompts: Sequence[Prompt | TokenPrompt], sampling: Sampling) -> list[list[Completion]]:
        # vLLM's TokensPrompt: the engine reads our ids as they are (a text prompt would be tokenized again,
        # with the special tokens vLLM adds by default)
        ids = prompt_ids(self.tokenizer, prompts)
        outputs = self.llm.generate(
            [{"prompt_token_ids": p} for p in ids], self.params(sampling), use_tqdm=False
        )
        return [
            [self._completion(o, len(p)) for o in out.outputs] for p, out in zip(ids, outputs, strict=True)
        ]

    @staticmethod
    def _completion(o, prompt_tokens: int) -> Completion:
        logprobs = None
        if o.logprobs is not None:
            logprobs = [step[token].logprob for step, token in zip(o.logprobs, o.token_ids, strict=True)]
        finish = "length" if o.finish_reason == "length" else "stop"
        return Completion(o.text, list(o.token_ids), finish, logprobs, prompt_tokens=prompt_tokens)


class VLLMServerGenerator:
    """``generate`` through TRL's ``VLLMClient`` (a ``trl vllm-serve`` server, whose weights TRL syncs); stop
    strings go in vLLM's request as ``stop``, and the text is cut at the first one as the engine does."""

    def __init__(self, client, tokenizer, chat: bool, seed: int = 0):
        self.client = client
        self.tokenizer = tokenizer
        self.chat = chat
        self.seed = seed

    def generate(self, prompts: Sequence[Prompt | TokenPrompt], sampling: Sampling) -> list[list[Completion]]:
        stop = list(sampling.stop)
        out = self.client.generate(
            prompts=prompt_ids(self.tokenizer, prompts),  # ids: the server reads them as they are
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
        return from_ids(self.tokenizer, out["completion_ids"], out["logprobs"], sampling)


def from_ids(tokenizer, completion_ids, logprobs, sampling: Sampling) -> list[list[Completion]]:
    """vLLM's completions as token ids (``sampling.n`` a prompt, in order) and their top-1 log-probs, as
    ours: the text decoded and cut at the first stop string, as the engine cuts it."""
    completions = []
    for ids, lps in zip(completion_ids, logprobs, strict=True):
        text, end = cut_at_stop(tokenizer.decode(ids, skip_special_tokens=True), sampling)
        finish = "length" if end is None and len(ids) >= sampling.max_new_tokens else "stop"
        completions.append(Completion(text, list(ids), finish, [step[0] for step in lps]))
    n = sampling.n
    return [completions[i * n : (i + 1) * n] for i in range(len(completions) // n)]


class TPGroupGenerator:
    """``generate`` through TRL's ``VLLMGeneration.generate`` (colocate mode, tensor parallelism > 1): the
    ranks of a TP group share one engine, and TRL gathers the prompts of every rank of the group
    (``all_gather_object`` over its ``tp_group``), generates them all and slices each rank's share back.

    TRL's slicing wants the same number of prompts on every rank of the group, in every call, and one
    sampling; a multi-turn rollout has none of these (episodes end at different turns, PPO's temperatures
    change between plays). Each call is therefore a round (hand-written): the ranks first exchange their
    prompt counts and samplings, then for each sampling any rank asked for (in one order) all call TRL's
    generate, their prompts repeated ``n`` times (TRL's colocate contract) and padded to the group's largest
    count with a one-token prompt. A rank whose rollouts ended calls :meth:`finish`
    (:func:`rollouts_done`), which takes part in the rounds until no rank asks.
    Deviation: ``sampling.seed`` is not sent (one seed on ``n`` copies of a prompt would give ``n`` equal
    samples); the engine's own seed, TRL's per TP group, draws."""

    def __init__(self, backend, tokenizer, chat: bool, seed: int = 0):
        self.backend = backend
        self.tokenizer = tokenizer
        self.chat = chat
        self.seed = seed

    @property
    def context_length(self) -> int:
        return self.backend.llm.llm_engine.model_config.max_model_len

    def generate(self, prompts: Sequence[Prompt | TokenPrompt], sampling: Sampling) -> list[list[Completion]]:
        if not prompts:
            return []
        return self.round(prompt_ids(self.tokenizer, prompts), sampling)

    def finish(self) -> None:
        """Take part in the group's rounds, with no prompt, until no rank of the group asks."""
        while self.round([], None) is not None:
            pass

    def round(self, ids: list[list[int]], sampling: Sampling | None) -> list[list[Completion]] | None:
        """One round of the group (class docstring); this rank's completions, None when no rank asked."""
        import torch.distributed as dist

        asks: list = [None] * self.backend.tensor_parallel_size
        dist.all_gather_object(asks, (len(ids), sampling), group=self.backend.tp_group)
        wanted = sorted({s for count, s in asks if count}, key=repr)
        if not wanted:
            return None
        mine: list[list[Completion]] = []
        for s in wanted:
            width = max(count * s.n for count, t in asks if t == s)
            rows = [x for x in ids for _ in range(s.n)] if s == sampling else []
            pad = [self.tokenizer.eos_token_id or 0]
            b = self.backend
            b.temperature = s.temperature
            b.max_completion_length = s.max_new_tokens
            b.top_p = s.top_p if s.temperature > 0 else 1.0
            b.generation_kwargs = {"stop": list(s.stop) or None, "include_stop_str_in_output": s.include_stop}
            _, out, logprobs, _ = b.generate(rows + [pad] * (width - len(rows)), None, num_generations=1)
            if s == sampling:
                mine = from_ids(self.tokenizer, out[: len(rows)], logprobs[: len(rows)], s)
        return mine


def rollouts_done(generator) -> None:
    """A rank's rollouts of a phase ended: with a TP group's engine (:class:`TPGroupGenerator`), it takes
    part in the others' rounds until theirs end too; with any other generator, nothing to do."""
    finish = getattr(generator, "finish", None)
    if finish is not None:
        finish()


def engine_generator(vllm_generation, tokenizer, chat: bool, seed: int = 0):
    """Our generator on TRL's vLLM backend (``trainer.vllm_generation``, or
    :mod:`rag_lab.train.vllm_engine`'s): its colocated engine (with tensor parallelism > 1, through TRL's
    generate, which gathers the TP group's prompts: :class:`TPGroupGenerator`), or its server's client (a
    process without one opens its own, for generation only)."""
    if vllm_generation.mode == "colocate" and vllm_generation.tensor_parallel_size > 1:
        return TPGroupGenerator(vllm_generation, tokenizer, chat, seed)
    if vllm_generation.mode == "colocate":
        return VLLMGenerator.around(vllm_generation.llm, tokenizer, chat, seed)
    client = getattr(vllm_generation, "vllm_client", None)
    if client is None:
        from trl.generation.vllm_client import VLLMClient

        client = VLLMClient(base_url=vllm_generation.server_base_url)
    return VLLMServerGenerator(client, tokenizer, chat, seed)
