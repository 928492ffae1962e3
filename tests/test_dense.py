"""Dense retrieval: pooling / prefix / normalisation conventions on tiny random encoders built here,
MiniLM against sentence-transformers, sharded embeddings, faiss index types, exclusion."""

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from rag_lab.core.config import build, compose
from rag_lab.core.errors import RagLabError
from rag_lab.data.base import Corpus
from rag_lab.retrievers.dense import DenseRetriever, Encoder

from conftest import TINY_DATA, cli

TEXTS = ["Ada was born in London.", "Paris is a city.", "The film was directed by Ada.", "London is a city.",
         "Who directed the film?", "Where was Ada born?", "Paris", "a city in London"]  # fmt: skip
CORPUS = Corpus([f"p{i}" for i in range(len(TEXTS))], [f"T{i}" for i in range(len(TEXTS))], TEXTS)


def hidden_and_mask(encoder: Encoder, texts: list[str]):
    """The encoder's last hidden states and the attention mask, as CPU tensors (on any device)."""
    enc = encoder.tokenizer(texts, padding=True, return_tensors="pt").to(encoder.model.device)
    with torch.no_grad():
        return encoder.model(**enc).last_hidden_state.float().cpu(), enc["attention_mask"].cpu()


@pytest.mark.parametrize(
    "pooling, normalize", [("mean", True), ("mean", False), ("cls", True), ("cls", False), ("last", True)]
)
def test_pooling_and_normalisation(tiny_encoder_dir, pooling, normalize):
    encoder = Encoder(tiny_encoder_dir, pooling=pooling, normalize=normalize, batch_size=3)
    texts = ["Ada was born in London.", "Paris", "The film was directed by Ada in the city of London."]
    got = encoder.encode(texts)
    hidden, mask = hidden_and_mask(encoder, texts)
    if pooling == "mean":  # masked mean: padding tokens never count
        m = mask.unsqueeze(-1).float()
        want = (hidden * m).sum(1) / m.sum(1)
    elif pooling == "last":  # each text's own last token, whatever the padding
        want = torch.stack([hidden[i, int(mask[i].nonzero().max())] for i in range(len(texts))])
    else:
        want = hidden[:, 0]
    if normalize:
        want = torch.nn.functional.normalize(want, dim=-1)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
    norms = np.linalg.norm(got, axis=1)
    assert np.allclose(norms, 1, atol=1e-5) == normalize


def test_prefixes_go_on_queries_and_passages(tiny_encoder_dir):
    encoder = Encoder(tiny_encoder_dir, query_prefix="query: ", passage_prefix="passage: ")
    retriever = DenseRetriever(CORPUS, encoder, show_progress=False)
    enc = retriever.encoder
    passages = enc.encode([f"T{i}\n{t}" for i, t in enumerate(TEXTS)], "passage: ")
    query = enc.encode(["where was ada born"], "query: ")[0]
    expected = passages @ query
    hits = retriever.search(["where was ada born"], k=3)[0]
    # Each hit's score is its prefixed passage · prefixed query, and the hits are the top 3
    # (compared by score: a random tiny encoder can leave near-ties).
    np.testing.assert_allclose([h.score for h in hits], [expected[int(h.id[1:])] for h in hits], rtol=1e-4)
    np.testing.assert_allclose([h.score for h in hits], np.sort(expected)[::-1][:3], rtol=1e-4)
    unprefixed = enc.encode(["where was ada born"])[0]
    assert not np.allclose(unprefixed, query)


def test_model_card_conventions_in_the_configs():
    def node(name):
        return compose([f"retriever={name}"]).retriever.encoder

    e5, bge, contriever, minilm = node("e5"), node("bge"), node("contriever"), node("minilm")
    assert (e5.model, e5.pooling, e5.normalize) == ("intfloat/e5-base-v2", "mean", True)
    assert (e5.query_prefix, e5.passage_prefix) == ("query: ", "passage: ")
    assert (bge.model, bge.pooling, bge.normalize) == ("BAAI/bge-large-en-v1.5", "cls", True)
    assert (
        bge.query_prefix == "Represent this sentence for searching relevant passages: "
        and bge.passage_prefix == ""
    )
    assert (contriever.model, contriever.pooling, contriever.normalize) == (
        "facebook/contriever-msmarco",
        "mean",
        False,
    )
    assert (minilm.pooling, minilm.normalize, minilm.query_prefix) == ("mean", True, "")


def test_minilm_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    from rag_lab.retrievers.dense import resolve_model

    name = "sentence-transformers/all-MiniLM-L6-v2"
    texts = ["Ada was born in London.", "Which film came out first, The Kraf or The Pekes?"]
    ours = Encoder(name, pooling="mean", normalize=True).encode(texts)
    reference = SentenceTransformer(resolve_model(name), device="cpu").encode(
        texts, normalize_embeddings=True
    )
    np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_sharded_fp16_embeddings_resume_after_a_lost_shard(tiny_encoder_dir, tmp_path):
    kwargs = {"shard_size": 3, "fp16": True, "cache_dir": str(tmp_path), "show_progress": False}
    first = DenseRetriever(CORPUS, Encoder(tiny_encoder_dir), **kwargs)
    (emb_dir,) = (tmp_path / "index" / "embeddings").iterdir()
    shards = sorted(emb_dir.glob("shard-*.npy"))
    assert len(shards) == 3 and np.load(shards[0]).dtype == np.float16
    kept = shards[0].stat().st_mtime_ns
    shards[1].unlink()
    for faiss_dir in (tmp_path / "index" / "faiss").iterdir():  # drop the index too: rebuilt from shards
        for f in faiss_dir.iterdir():
            f.unlink()
        faiss_dir.rmdir()
    second = DenseRetriever(CORPUS, Encoder(tiny_encoder_dir), **kwargs)
    assert shards[1].exists() and shards[0].stat().st_mtime_ns == kept
    assert second.search(["Ada"], 4) == first.search(["Ada"], 4)


@pytest.mark.parametrize("factory", ["Flat", "HNSW8", "IVF2,Flat"])
def test_faiss_index_types_find_the_exact_passage(tiny_encoder_dir, factory):
    """Every query's best passage leads the next by far more than float rounding (~1e-7, and CPUs
    differ there): an approximate index that is working finds it on any machine, not by a near-tie."""
    encoder = Encoder(tiny_encoder_dir)
    retriever = DenseRetriever(CORPUS, encoder, index_factory=factory, nprobe=2, show_progress=False)
    passages = [f"T{i}\n{t}" for i, t in enumerate(TEXTS)]
    queries = ["the film was directed by ada", *passages]  # and each passage's own text
    scores = encoder.encode(queries) @ encoder.encode(passages).T
    top2 = np.sort(scores, axis=1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0]).min() > 1e-3
    assert [hits[0].id for hits in retriever.search(queries, 1)] == [f"p{i}" for i in scores.argmax(1)]
    assert scores.argmax(1).tolist() == [2, *range(len(TEXTS))]  # the film's passage, then itself


def test_exclusion_and_empty_queries(tiny_encoder_dir):
    retriever = DenseRetriever(CORPUS, Encoder(tiny_encoder_dir), show_progress=False)
    full = retriever.search(["Paris city"], 3)[0]
    excluded = retriever.search(["Paris city", "", "  "], 2, exclude=[{full[0].id}, (), ()])
    assert [h.id for h in excluded[0]] == [h.id for h in full[1:3]]
    assert excluded[1] == excluded[2] == []


def test_missing_model_is_one_line():
    with pytest.raises(RagLabError, match=r"model 'org/not-a-model' is not available offline: download it"):
        Encoder("org/not-a-model")


@pytest.mark.parametrize("factory", ["Flat", "HNSW8", "IVF2,Flat"])
def test_a_cached_faiss_index_is_memory_mapped_and_searches_the_same(tiny_encoder_dir, tmp_path, factory):
    """Built, written and mapped; then read from the cache, mapped again: the file's pages are in the
    process's maps (not a private copy), and both search exactly as the index built in memory does."""
    encoder = Encoder(tiny_encoder_dir)
    kwargs = {"index_factory": factory, "nprobe": 2, "show_progress": False}
    queries = ["the film was directed by ada", "paris city", "who was born in london"]
    in_memory = DenseRetriever(CORPUS, encoder, **kwargs).search(queries, 5)

    def mappings() -> int:
        (file,) = (tmp_path / "index" / "faiss").glob("*/index.faiss")
        return open("/proc/self/maps").read().count(str(file.resolve()))

    built = DenseRetriever(CORPUS, encoder, cache_dir=str(tmp_path), **kwargs)
    after_build = mappings()
    loaded = DenseRetriever(CORPUS, encoder, cache_dir=str(tmp_path), **kwargs)
    assert after_build >= 1 and mappings() > after_build
    assert built.search(queries, 5) == loaded.search(queries, 5) == in_memory


def test_the_index_goes_on_the_one_gpu_index_device_names(tiny_cfg, tiny_encoder_dir, monkeypatch, tmp_path):
    """``retriever.index_device=cuda:1`` through the run's composition, faiss made to see two GPUs: one copy,
    on GPU 1 (``index_cpu_to_gpu``), never one a GPU; ``cpu`` keeps the index mapped from the cache."""
    import faiss

    moved = []
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 2, raising=False)
    monkeypatch.setattr(faiss, "StandardGpuResources", lambda: "resources", raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_gpu", lambda *args: moved.append(args) or args[2], raising=False)
    monkeypatch.setattr(
        faiss, "index_cpu_to_all_gpus", lambda *a, **k: pytest.fail("a copy a GPU"), raising=False
    )
    overrides = ["retriever=minilm", f"retriever.encoder.model={tiny_encoder_dir}",
                 f"retriever.cache_dir={tmp_path}", "retriever.encoder.max_length=64",
                 "+retriever.show_progress=false"]  # fmt: skip
    on_gpu = build(tiny_cfg(*overrides, "retriever.index_device=cuda:1").retriever, corpus=CORPUS)
    assert [(resources, device) for resources, device, _ in moved] == [("resources", 1)]
    assert on_gpu.index is moved[0][2] and on_gpu.index_device == "cuda:1"
    on_cpu = build(tiny_cfg(*overrides).retriever, corpus=CORPUS)
    assert len(moved) == 1 and on_cpu.index_device == "cpu"
    (file,) = tmp_path.glob("index/faiss/*/index.faiss")
    assert str(file.resolve()) in Path("/proc/self/maps").read_text()  # mapped, not a private copy
    queries = ["where was ada born", "the film was directed by ada", "paris city"]
    assert on_gpu.search(queries, 3) == on_cpu.search(queries, 3)


@pytest.mark.parametrize(
    "command, overrides, line",
    [
        ("run", ["retriever.index_device=gpu"], r"'retriever\.index_device': 'gpu' is not cpu or cuda:<N>"),
        ("serve", ["retriever.index_device=cuda:64"], r"'retriever\.index_device': cuda:64, but faiss sees "),
        ("serve", ["retriever.encoder.device=cuda:64"],
         r"'retriever\.encoder\.device': cuda:64, but torch sees "),
        ("run", ["retriever.index_device=cuda:0", "launch=cpu2"],
         r"'retriever\.index_device': each of the 2 processes of a node would copy the index onto cuda:0: "),
    ],
)  # fmt: skip
def test_a_bad_device_is_one_line_naming_the_key(command, overrides, line, capfd, monkeypatch, tmp_path):
    args = [*TINY_DATA, "retriever=minilm", *overrides]
    args += [f"hydra.run.dir={tmp_path}"] if command == "run" else []
    rc, out = cli(command, args, capfd, monkeypatch)
    assert rc == 1 and re.fullmatch(rf"error: config {line}.*\n", out), out
