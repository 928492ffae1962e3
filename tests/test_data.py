import json

import pytest

from rag_lab.data.base import Corpus, DataError
from rag_lab.data.flashrag import FlashRAGDataset, load_corpus
from rag_lab.data.synth import SynthDataset

GOOD = {"id": "q1", "question": "Who?", "golden_answers": ["A", "B"], "metadata": {"type": "single_hop"}}


def write_lines(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))


@pytest.fixture
def flashrag_dir(tmp_path):
    write_lines(tmp_path / "corpus.jsonl", [{"id": "p1", "contents": '"Title One"\nText one.'}])
    return tmp_path


def test_flashrag_reads_examples_and_corpus(flashrag_dir):
    write_lines(flashrag_dir / "test.jsonl", [GOOD])
    ds = FlashRAGDataset(str(flashrag_dir), str(flashrag_dir / "corpus.jsonl"))
    (ex,) = ds.split("test")
    assert (ex.id, ex.answers, ex.type) == ("q1", ("A", "B"), "single_hop")
    assert ds.corpus.get("p1").title == "Title One"


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"test.jsonl:2: malformed JSON"),
        ({k: v for k, v in GOOD.items() if k != "question"}, r"test.jsonl:2: missing field 'question'"),
        (GOOD | {"golden_answers": "A"}, r"test.jsonl:2: field 'golden_answers' should be list, got str"),
        ([1, 2], r"test.jsonl:2: expected a JSON object"),
    ],
)
def test_malformed_line_names_file_line_and_field(flashrag_dir, line, message):
    write_lines(flashrag_dir / "test.jsonl", [GOOD, line, GOOD | {"id": "q3"}])
    ds = FlashRAGDataset(str(flashrag_dir), str(flashrag_dir / "corpus.jsonl"))
    with pytest.raises(DataError, match=message):
        ds.split("test")
    skipping = FlashRAGDataset(str(flashrag_dir), str(flashrag_dir / "corpus.jsonl"), skip_malformed=True)
    assert [ex.id for ex in skipping.split("test")] == ["q1", "q3"]
    assert skipping.skipped == {"test": 1}


def test_missing_files_say_where_to_get_them(tmp_path):
    ds = FlashRAGDataset(str(tmp_path), str(tmp_path / "corpus.jsonl"), make_target="data-x")
    with pytest.raises(DataError, match=r"split 'test' not found at .*test.jsonl; get it from .*make data-x"):
        ds.split("test")
    with pytest.raises(DataError, match=r"corpus not found"):
        _ = ds.corpus


def test_duplicate_passage_ids_are_named(tmp_path):
    with pytest.raises(DataError, match=r"duplicate passage ids: p1"):
        Corpus(["p1", "p2", "p1"], ["a", "b", "c"], ["x", "y", "z"])
    write_lines(tmp_path / "c.jsonl", [{"id": "p1", "contents": "T\nx"}, {"id": "p1", "contents": "T\ny"}])
    with pytest.raises(DataError, match=r"c.jsonl: duplicate passage ids: p1"):
        load_corpus(tmp_path / "c.jsonl")


def small_world(cache_dir, seed=0):
    return SynthDataset(str(cache_dir), seed=seed, n_people=60, n_cities=12, n_countries=4, n_films=20,
                        dev_size=20, test_size=40)  # fmt: skip


def test_synth_is_deterministic_and_cached(tmp_path):
    a, b = small_world(tmp_path / "a"), small_world(tmp_path / "b")
    assert (a.root / "test.jsonl").read_bytes() == (b.root / "test.jsonl").read_bytes()
    assert (a.root / "corpus.jsonl").read_bytes() == (b.root / "corpus.jsonl").read_bytes()
    mtime = (a.root / "corpus.jsonl").stat().st_mtime_ns
    assert small_world(tmp_path / "a").root == a.root
    assert (a.root / "corpus.jsonl").stat().st_mtime_ns == mtime  # reused, not regenerated
    assert small_world(tmp_path / "a", seed=1).root != a.root


def test_synth_splits_are_disjoint_and_supports_exist(tmp_path):
    ds = small_world(tmp_path)
    splits = {name: ds.split(name) for name in ["train", "dev", "test"]}
    assert [len(splits["dev"]), len(splits["test"])] == [20, 40]
    questions = [{ex.question for ex in exs} for exs in splits.values()]
    assert not (questions[0] & questions[1] or questions[0] & questions[2] or questions[1] & questions[2])
    for ex in splits["test"]:
        assert ex.answers and len(ex.decomposition) == ex.hops
        if ex.answerable:
            assert all(pid in ds.corpus for pid in ex.supporting_ids)
            titles = {ds.corpus.get(pid).title for pid in ex.supporting_ids}
            # Each sub-answer is stated in the passage of the step's subject.
            for step in ex.decomposition:
                assert step.answer in ds.corpus.get(step.support_id).text
            assert len(titles) == len(ex.supporting_ids)
        else:
            assert any(step.support_id is None for step in ex.decomposition)


def test_synth_difficulty_knob_selects_questions_of_the_same_world(tmp_path):
    """question_types / question_max_hops keep a selection of every split; the world (cache entry, corpus,
    every question: what the tiny LM reads) is the same."""
    whole = small_world(tmp_path)
    easy = SynthDataset(str(tmp_path), seed=0, n_people=60, n_cities=12, n_countries=4, n_films=20,
                        dev_size=20, test_size=40, question_max_hops=2)  # fmt: skip
    assert easy.root == whole.root and easy.corpus.fingerprint == whole.corpus.fingerprint
    for split in ["train", "dev", "test"]:
        assert easy.split(split) == [ex for ex in whole.split(split) if ex.hops <= 2]
        assert easy.world.split(split) == whole.split(split)
    assert {ex.hops for ex in whole.split("test")} - {1, 2}  # the selection dropped something
    one = SynthDataset(str(tmp_path), seed=0, n_people=60, n_cities=12, n_countries=4, n_films=20,
                       dev_size=20, test_size=40, question_types=["single_hop", "comparison"])  # fmt: skip
    assert {ex.type for ex in one.split("train")} == {"single_hop", "comparison"}
    assert whole.world is whole
    with pytest.raises(DataError, match=r"data.question_types: unknown type 'two_hop' \(known: single_hop"):
        SynthDataset(str(tmp_path), question_types=["two_hop"])
    with pytest.raises(DataError, match=r"data.question_max_hops: 0 keeps no question"):
        SynthDataset(str(tmp_path), question_max_hops=0)


def test_synth_sizes_larger_than_the_world_are_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"data.dev_size \+ data.test_size = 600, but this world has only"):
        SynthDataset(str(tmp_path), n_people=30, n_films=10, dev_size=300, test_size=300)


def test_synth_round_trips_through_musique_format(tmp_path):
    from rag_lab.data.musique import MuSiQueDataset

    ds = small_world(tmp_path)
    files = {split: f"musique_{split}.jsonl" for split in ["train", "dev", "test"]}
    mq = MuSiQueDataset(str(ds.root), split_files=files)
    for split in files:
        assert mq.split(split) == ds.split(split)
    assert any(not ex.answerable for split in files for ex in ds.split(split))
    # The union of contexts holds every support, with the same stable ids as the synth corpus.
    for ex in ds.split("test"):
        for pid in ex.supporting_ids:
            assert mq.corpus.get(pid) == ds.corpus.get(pid)


SYNTH_FILES = {split: split for split in ["train", "dev", "test"]}


@pytest.mark.parametrize("fmt", ["hotpotqa", "2wiki"])
def test_synth_round_trips_through_hotpotqa_and_2wiki_formats(tmp_path, fmt):
    from rag_lab.data.hotpotqa import HotpotQADataset, TwoWikiDataset

    ds = small_world(tmp_path)
    cls = HotpotQADataset if fmt == "hotpotqa" else TwoWikiDataset
    loaded = cls(str(ds.root), split_files={s: f"{fmt}_{s}.json" for s in SYNTH_FILES})
    for split in SYNTH_FILES:
        # These formats carry no decomposition / answerable flag, and HotpotQA no aliases (2Wiki has
        # them through id_aliases.json): compare what each carries.
        n_answers = 1 if fmt == "hotpotqa" else None
        got = [(ex.id, ex.question, ex.answers, ex.type, ex.supporting_ids) for ex in loaded.split(split)]
        want = [
            (ex.id, ex.question, ex.answers[:n_answers], ex.type, ex.supporting_ids) for ex in ds.split(split)
        ]
        assert got == want
    for ex in ds.split("dev"):
        for pid in ex.supporting_ids:
            assert loaded.corpus.get(pid) == ds.corpus.get(pid)


def test_hotpotqa_hugging_face_layout_and_2wiki_aliases(tmp_path):
    from rag_lab.data.hotpotqa import HotpotQADataset, TwoWikiDataset

    hf_row = {"id": "h1", "question": "Q?", "answer": "Paris", "type": "bridge", "level": "easy",
              "supporting_facts": {"title": ["A", "A"], "sent_id": [0, 1]},
              "context": {"title": ["A", "B"], "sentences": [["a1. ", "a2."], ["b1."]]}}  # fmt: skip
    (tmp_path / "hf.jsonl").write_text(json.dumps(hf_row) + "\n")
    ds = HotpotQADataset(str(tmp_path), split_files={"dev": "hf.jsonl"})
    (ex,) = ds.split("dev")
    assert ds.corpus.get(ex.supporting_ids[0]).text == "a1. a2."
    assert len(ds.corpus) == 2 and ex.hops == 1

    official = {"_id": "w1", "question": "Q?", "answer": "France", "answer_id": "Q142", "type": "comparison",
                "supporting_facts": [["A", 0]], "context": [["A", ["x."]]],
                "evidences": [["A", "country", "France"]]}  # fmt: skip
    (tmp_path / "dev.json").write_text(json.dumps([official]))
    aliases = {"Q_id": "Q142", "aliases": ["French Republic", "France"], "demonyms": ["French"]}
    (tmp_path / "id_aliases.json").write_text(json.dumps(aliases) + "\n")
    (ex,) = TwoWikiDataset(str(tmp_path), split_files={"dev": "dev.json"}).split("dev")
    assert ex.answers == ("France", "French", "French Republic")
    assert ex.metadata["evidences"] == [["A", "country", "France"]]


def test_json_list_errors_name_the_item(tmp_path):
    from rag_lab.data.hotpotqa import HotpotQADataset

    good = {"_id": "a", "question": "Q?", "answer": "x", "supporting_facts": [], "context": []}
    (tmp_path / "dev.json").write_text(json.dumps([good, {"_id": "b", "question": "Q?"}]))
    ds = HotpotQADataset(str(tmp_path), split_files={"dev": "dev.json"})
    with pytest.raises(DataError, match=r"dev.json: item 1 \(id b\): missing field 'supporting_facts'"):
        ds.split("dev")
    (tmp_path / "dev.json").write_text('[{"_id": "a",\n "question": }]')
    with pytest.raises(DataError, match=r"dev.json:2:\d+: malformed JSON"):
        HotpotQADataset(str(tmp_path), split_files={"dev": "dev.json"}).split("dev")


def test_dpr_tsv_corpus(tmp_path):
    path = tmp_path / "psgs_w100.tsv"
    path.write_text('id\ttext\ttitle\n1\t"Aaron is a prophet."\tAaron\n2\tParis is a city.\t"Paris"\n')
    corpus = load_corpus(path)
    assert corpus.get("1").title == "Aaron" and corpus.get("1").text == "Aaron is a prophet."
    assert corpus.get("2").title == "Paris"
    path.write_text("id\ttext\ttitle\n1\tonly two\n")
    with pytest.raises(DataError, match=r"psgs_w100.tsv:2: expected 3 tab-separated fields"):
        load_corpus(path)


def test_sample_draws_disjoint_dev_and_test_from_one_file(tmp_path):
    """Stop-RAG's protocol: 1000 validation and 1000 test questions, both from the official dev file."""
    from rag_lab.data.musique import MuSiQueDataset

    ds = small_world(tmp_path)
    files = {"train": "musique_train.jsonl", "dev": "musique_dev.jsonl", "test": "musique_dev.jsonl"}
    whole = MuSiQueDataset(str(ds.root), split_files=files).split("dev")
    mq = MuSiQueDataset(str(ds.root), split_files=files, sample={"dev": 5, "test": 7}, sample_seed=3)
    dev, test = mq.split("dev"), mq.split("test")
    assert len(dev) == 5 and len(test) == 7 and not {e.id for e in dev} & {e.id for e in test}
    assert {e.id for e in dev + test} <= {e.id for e in whole} and dev != whole[:5]
    assert (
        MuSiQueDataset(str(ds.root), split_files=files, sample={"dev": 5}, sample_seed=3).split("dev") == dev
    )
    assert mq.split("train") == ds.split("train")  # unsampled splits are whole
