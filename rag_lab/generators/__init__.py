"""Generators (``conf/generator/``): ``generate(prompts, sampling) -> completions``."""

from rag_lab.generators.base import Completion, Generator, Sampling

__all__ = ["Completion", "Generator", "Sampling"]
