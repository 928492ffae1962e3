"""Datasets: QA examples, passages and corpora; one loader per on-disk format (``conf/data/``)."""

from rag_lab.data.base import Corpus, DataError, Dataset, Passage, QAExample

__all__ = ["Corpus", "DataError", "Dataset", "Passage", "QAExample"]
