"""Build a retriever's index ahead of time: ``python -m rag_lab.index retriever=<name> data=<name>``.

    python -m rag_lab.index retriever=minilm                 # the embedded world
    python -m rag_lab.index retriever=e5 data=musique data.path=data/musique

Composes the same config as the runner, builds the corpus and the retriever (which encodes,
indexes and writes its on-disk cache under ``cache_dir``), and prints the time it took. A later
run with the same corpus and retriever config loads the cached index instead of rebuilding it.
"""

import sys
import time

from hydra.utils import instantiate

from rag_lab.core.cli import cli_overrides
from rag_lab.core.config import compose
from rag_lab.core.errors import one_line_errors
from rag_lab.data.evidence import Evidence, index_corpus


def main(argv: list[str] | None = None) -> None:
    with one_line_errors():
        cfg = compose(cli_overrides(list(sys.argv[1:] if argv is None else argv), __doc__, "config"))
        data = instantiate(cfg.data)
        start = time.perf_counter()
        corpus = index_corpus(data, Evidence(**cfg.corpus))  # corpus.coverage / distractors: the run's index
        loaded = time.perf_counter()
        instantiate(cfg.retriever, corpus=corpus)
        built = time.perf_counter()
    name = cfg.retriever._target_.rsplit(".", 1)[-1]
    print(
        f"{name} over {data.name} ({len(corpus):,} passages): corpus {loaded - start:.1f} s, "
        f"index {built - loaded:.1f} s; cached under {cfg.cache_dir}/index/"
    )


if __name__ == "__main__":
    main()
