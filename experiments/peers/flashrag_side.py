"""FlashRAG's side of ``experiments/bench_vs_flashrag.py``: runs in the peers environment (``make
bench-peers`` builds ``.venv-peers``), imports FlashRAG only, never rag_lab.

    flashrag_side.py run SPEC.json OUT.json     # one pipeline on one generator: predictions, prompts, timing
    flashrag_side.py score PREDS.json OUT.json  # FlashRAG's own evaluator (em, f1, acc) on given predictions

Two workarounds for ``flashrag-dev`` 0.1.2, the release on PyPI, both outside FlashRAG's code:

- its wheel leaves out ``flashrag/config/basic_config.yaml``, which ``Config`` merges every run's keys over
  (FileNotFoundError as shipped): :class:`BenchConfig` supplies the defaults itself, every key the two
  pipelines, the HF generator, the BM25 retriever and the evaluator read;
- its BM25 retriever returns each query's documents as a numpy array, which ``Dataset.save`` cannot write
  (TypeError): :class:`ListBM25` turns them into lists. The index itself is built by the bench (FlashRAG's
  builder in 0.1.2 indexes characters, not words) with FlashRAG's query tokenization.

And one for the tiny LM: FlashRAG reads the tokenizer from the model's folder, where transformers 5 builds
Qwen2's byte-level tokenizer for any ``qwen2`` config (``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS``), not
the word-level one saved there. With ``tokenizer_path`` in the spec, :func:`use_tokenizer` loads the right
one from its own folder and hands it to the generator and the prompt template, set up as FlashRAG sets up its
own (left padding; the end-of-sequence token pads unless the model's name holds ``qwen``).
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchlib import ForwardClock, peak_rss_mb  # noqa: E402

DEFAULTS = {
    # every key FlashRAG 0.1.2 reads on this path; the bench's spec overrides the run's own
    "data_dir": "dataset/",
    "dataset_name": "bench",
    "split": ["test"],
    "test_sample_num": None,
    "random_sample": False,
    "save_dir": "output/",
    "save_note": "bench",
    "save_intermediate_data": False,
    "save_metric_score": False,
    "seed": 2024,
    "gpu_id": None,
    "framework": "hf",
    "retrieval_method": "bm25",
    "bm25_backend": "bm25s",
    "index_path": None,
    "corpus_path": None,
    "retrieval_topk": 5,
    "retrieval_batch_size": 256,
    "retrieval_use_fp16": False,
    "retrieval_query_max_length": 128,
    "retrieval_pooling_method": None,
    "save_retrieval_cache": False,
    "use_retrieval_cache": False,
    "retrieval_cache_path": None,
    "use_reranker": False,
    "rerank_model_name": None,
    "rerank_model_path": None,
    "rerank_pooling_method": None,
    "refiner_name": None,
    "use_fid": False,
    "generator_model": None,
    "generator_model_path": None,
    "generator_lora_path": None,
    "generator_max_input_len": 1024,
    "generator_batch_size": 64,
    "generation_params": {},
    "model2path": {},
    "model2pooling": {},
    "method2index": {},
    "metrics": ["em", "f1", "acc"],
    "metric_setting": {},
}


def bench_config(settings: dict):
    from flashrag.config import Config

    class BenchConfig(Config):
        """FlashRAG's Config with its defaults from :data:`DEFAULTS` (the wheel misses its yaml)."""

        def _get_internal_config(self):
            return json.loads(json.dumps(DEFAULTS))

    return BenchConfig(config_dict=settings)


def list_bm25(config):
    from flashrag.retriever import BM25Retriever

    class ListBM25(BM25Retriever):
        """Rows as lists of plain dicts, each with its score (FlashRAG's bm25s path returns numpy arrays);
        ``seconds`` adds up the time spent searching."""

        seconds = 0.0

        def _batch_search(self, query_list, num=None, return_score=False):
            start = time.perf_counter()
            docs, scores = super()._batch_search(query_list, num, True)
            self.seconds += time.perf_counter() - start
            scores = [[float(s) for s in row] for row in scores]
            docs = [
                [dict(d, score=s) for d, s in zip(row, sc, strict=True)]
                for row, sc in zip(docs, scores, strict=True)
            ]
            return (docs, scores) if return_score else docs

    return ListBM25(config)


def use_tokenizer(path: str, generator, template) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if "qwen" not in generator.model_name.lower():
        tokenizer.pad_token = tokenizer.eos_token
    generator.tokenizer = template.tokenizer = tokenizer


def run(spec: dict) -> dict:
    """One FlashRAG pipeline (``sequential`` or ``iterative``) over the spec's dataset; the clock covers
    ``pipeline.run`` (retrieval, prompts, generation), not loading the model or the index."""
    from flashrag.pipeline import IterativePipeline, SequentialPipeline
    from flashrag.prompt import PromptTemplate
    from flashrag.utils import get_dataset

    start = time.perf_counter()
    config = bench_config(spec["config"])
    template = PromptTemplate(config, enable_chat=spec["chat"], **spec["prompt"])
    if spec["pipeline"] == "sequential":
        pipe = SequentialPipeline(config, prompt_template=template, retriever=list_bm25(config))
    else:
        pipe = IterativePipeline(config, prompt_template=template, iter_num=spec["iterations"])
        pipe.retriever = list_bm25(config)
    if spec.get("tokenizer_path"):
        use_tokenizer(spec["tokenizer_path"], pipe.generator, template)
    dataset = get_dataset(config)["test"]
    pipe.retriever.batch_search(["warm up"])  # bm25s's numba top-k compiles on its first call
    pipe.retriever.seconds = 0.0
    load = time.perf_counter() - start
    clock = ForwardClock(pipe.generator.model)
    start = time.perf_counter()
    dataset = pipe.run(dataset, do_eval=False)
    seconds = time.perf_counter() - start
    clock.close()
    rounds = spec.get("iterations", 1) if spec["pipeline"] == "iterative" else 1
    out = []
    for item in dataset:
        if spec["pipeline"] == "iterative":
            prompts = [item.output[f"prompt_iter_{r}"] for r in range(rounds)]
            found = [item.output[f"retrieval_result_iter_{r}"] for r in range(rounds)]
            answers = [item.output[f"pred_iter_{r}"] for r in range(rounds)]
        else:
            prompts, found, answers = (
                [item.output["prompt"]],
                [item.output["retrieval_result"]],
                [item.output["pred"]],
            )
        out.append(
            {
                "id": item.id,
                "prediction": item.output["pred"],
                "prompts": prompts,
                "retrieved": [[d["id"] for d in docs] for docs in found],
                "scores": [[d["score"] for d in docs] for docs in found],
                "answers": answers,
            }
        )
    return {
        "seconds": seconds,
        "load_seconds": load,
        "peak_rss_mb": peak_rss_mb(),
        **clock.seconds,
        "retrieve": pipe.retriever.seconds,
        "items": out,
    }


def score(preds: dict) -> dict:
    """FlashRAG's metrics (``ExactMatch``, ``F1_Score``, ``Sub_ExactMatch``) on the given predictions."""
    from flashrag.dataset import Dataset, Item
    from flashrag.evaluator.metrics import ExactMatch, F1_Score, Sub_ExactMatch

    config = {"dataset_name": "bench", "metric_setting": {}}
    items = [Item({"id": r["id"], "question": "", "golden_answers": r["golds"]}) for r in preds["items"]]
    dataset = Dataset(config=config, data=items)
    dataset.update_output("pred", [r["prediction"] for r in preds["items"]])
    result = {}
    for metric in (ExactMatch, F1_Score, Sub_ExactMatch):
        overall, per_item = metric(config).calculate_metric(dataset)
        result.update({name: 100 * value for name, value in overall.items()})
        result[f"{metric(config).metric_name}_per_item"] = per_item
    return result


def main() -> None:
    if len(sys.argv) != 4 or sys.argv[1] not in ("run", "score"):
        sys.exit("usage: flashrag_side.py run SPEC.json OUT.json | score PREDS.json OUT.json")
    task, source, target = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    result = (run if task == "run" else score)(json.loads(source.read_text()))
    target.with_suffix(".part").write_text(json.dumps(result))
    target.with_suffix(".part").rename(target)  # whole or absent: the bench reuses a result it finds


if __name__ == "__main__":
    main()
