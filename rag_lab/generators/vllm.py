"""``generator=vllm``: the same interface on vLLM's offline engine (GPU machines; ``make install-gpu``).

vLLM is imported when this backend is built, so the package imports without it; when it is
missing the error says how to install it. Chat prompts go through the model's chat template,
stop strings through vLLM's own (``include_stop_str_in_output`` for ``include_stop``), and the
log-prob of each sampled token comes back with ``logprobs=0``.
Not exercised by the test suite (no GPU there): check it on a GPU machine.
"""

from collections.abc import Sequence

from rag_lab.errors import RagLabError
from rag_lab.generators.base import Completion, Prompt, Sampling, render
from rag_lab.ranges import OpenUnit, PositiveInt


class VLLMGenerator:
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
    ):
        try:
            import vllm
        except ImportError:
            raise RagLabError(
                "generator=vllm needs vLLM: `make install-gpu` (pip install 'rag_lab[gpu]') on a CUDA machine"
            ) from None
        self._vllm = vllm
        self.llm = vllm.LLM(
            model=model,
            tensor_parallel_size=tensor_parallel_size,
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
        )
        self.tokenizer = self.llm.get_tokenizer()
        # the most tokens the engine reads (prompts are fitted to it: rag_lab.env.fit)
        self.context_length = self.llm.llm_engine.model_config.max_model_len
        self.seed, self.want_logprobs, self.chat = seed, logprobs, chat

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[list[Completion]]:
        params = self._vllm.SamplingParams(
            n=sampling.n,
            temperature=sampling.temperature,
            top_p=sampling.top_p if sampling.temperature > 0 else 1.0,
            max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop) or None,
            include_stop_str_in_output=sampling.include_stop,
            seed=self.seed if sampling.seed is None else sampling.seed,
            logprobs=0 if self.want_logprobs else None,
        )
        outputs = self.llm.generate([render(self.tokenizer, p) for p in prompts], params, use_tqdm=False)
        return [[self._completion(o) for o in out.outputs] for out in outputs]

    @staticmethod
    def _completion(o) -> Completion:
        logprobs = None
        if o.logprobs is not None:
            logprobs = [step[token].logprob for step, token in zip(o.logprobs, o.token_ids, strict=True)]
        finish = "length" if o.finish_reason == "length" else "stop"
        return Completion(o.text, list(o.token_ids), finish, logprobs)
