"""generator=tiny end to end on the tiny world with toy sizes: trains once, then reuses."""

import random
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from rag_lab.run import run


@pytest.fixture(scope="module")
def toy_cache(tmp_path_factory) -> Path:
    """One cache for the tests that train the toy tiny LM with the same settings: the first trains it,
    the next reuse it (each test asserts what it needs either way)."""
    return tmp_path_factory.mktemp("toy-cache")


def test_tiny_lm_trains_once_and_runs_a_policy(tiny_cfg, toy_cache, tmp_path):
    cfg = tiny_cfg("generator=tiny", "policy=fixed_iter", "policy.iterations=2", "eval.limit=4",
                   f"cache_dir={toy_cache}")  # fmt: skip
    metrics = run(cfg, tmp_path / "run")
    assert metrics["all"]["n"] == 4 and metrics["all"]["tokens_total"] > 0
    # The recipe's base model and its protocol stage, each cached.
    checkpoints = sorted((toy_cache / "tiny_lm").iterdir())
    assert len(checkpoints) == 2
    assert all((c / "model.safetensors").exists() and (c / "train.json").exists() for c in checkpoints)
    stamps = [(c / "model.safetensors").stat().st_mtime_ns for c in checkpoints]
    data = instantiate(cfg.data)
    generator = instantiate(cfg.generator, data=data)  # same sizes and world: reused, not retrained
    assert [(c / "model.safetensors").stat().st_mtime_ns for c in checkpoints] == stamps
    assert generator.chat is False and sorted((toy_cache / "tiny_lm").iterdir()) == checkpoints
    checkpoint = Path(generator.model.name_or_path)
    assert checkpoint in checkpoints
    # names as their syllables (generator.name_pieces): more tokens than words, decoded back exactly
    tokenizer = AutoTokenizer.from_pretrained(checkpoint / "tokenizer")
    name = next(t for t in data.corpus.titles if " " in t)
    ids = tokenizer(name, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == name and len(ids) > len(name.split())


def test_the_shipped_checkpoint_is_loaded_only_for_its_world_and_recipe(
    tiny_cfg, toy_cache, tmp_path, caplog
):
    """ship() writes a checkpoint with its fingerprints and card; tiny_lm loads it for the same world and
    settings, and for another world or setting trains with the recipe, saying which differs."""
    import json

    from rag_lab.train.tiny import generator as tiny
    from rag_lab.train.tiny.recipe import oracle_chains, train
    from rag_lab.train.tiny.ship import ship

    from conftest import TINY_DATA, TINY_LM

    toy = [
        *TINY_DATA,
        *TINY_LM,
        "generator.reading_steps=4",
        "generator.tune_steps=2",
        f"cache_dir={toy_cache}",
    ]
    out = ship(toy, out=tmp_path / "shipped")
    card = json.loads((out / "recipe.json").read_text())
    assert card["recipe"]["tune_steps"] == 2 and (out / "tokenizer" / "tokenizer.json").exists()
    assert "## Recipe" in (out / "README.md").read_text()
    cfg = tiny_cfg("generator=tiny", *toy)
    data = instantiate(cfg.data)
    settings = tiny.recipe_settings(tiny.recipe_part(OmegaConf.to_container(cfg.generator, resolve=True)))
    assert card["world"] == tiny.world_fingerprint(data)
    assert tiny.shipped_for(data, settings, shipped=out) == out
    with caplog.at_level("WARNING"):
        assert tiny.shipped_for(data, {**settings, "lr": 0.5}, shipped=out) is None
    assert "settings lr differ" in caplog.text
    other = instantiate(tiny_cfg("generator=tiny", *toy, "data.seed=1").data)
    with caplog.at_level("WARNING"):
        assert tiny.shipped_for(other, settings, shipped=out) is None
    assert f"the world differs (fingerprint {tiny.world_fingerprint(other)}" in caplog.text
    # Shipping again replaces it in place (same model: the recipe's cached one).
    assert ship(toy, out=out) == out and json.loads((out / "recipe.json").read_text()) == card
    # A chain stage on this recipe starts from the shipped checkpoint of its earlier stages (found by its
    # card: the same recipe but the chain keys) and trains alone; its demos:cot pool holds the teacher's
    # chains over gold passages.
    chained = {**settings, "chain_steps": 2}
    assert tiny.before_chain_for(data, chained, shipped_root=tmp_path) == out
    assert tiny.before_chain_for(data, {**chained, "lr": 0.5}, shipped_root=tmp_path) is None
    assert tiny.before_chain_for(data, settings, shipped_root=tmp_path) is None  # no chain stage: none
    path = train(data, str(tmp_path / "chain"), before_chain=out, **chained)
    assert [p.name for p in (tmp_path / "chain" / "tiny_lm").iterdir()] == [path.name]
    assert json.loads((path / "train.json").read_text())["base"] == "shipped"
    chains = oracle_chains(data, data.split("train")[:5])
    assert chains and all(p.startswith("Documents:") and "\nReasoning:" in p for p in chains)
    # So does a generalist stage (issue 64), from the shipped checkpoint whose recipe is this one without it;
    # a shipped checkpoint with a generalist stage is no start for one, and neither is a recipe without it.
    general = {**settings, "generalist_steps": 2, "generalist_verbatim": 1.0}
    assert tiny.before_generalist_for(data, general, shipped_root=tmp_path) == out
    assert tiny.before(data, general) == {}  # rag_lab/checkpoints holds no start for the toy world
    assert tiny.before_generalist_for(data, {**general, "lr": 0.5}, shipped_root=tmp_path) is None
    assert tiny.before_generalist_for(data, settings, shipped_root=tmp_path) is None
    path = train(data, str(tmp_path / "general"), before_generalist=out, **general)
    assert [p.name for p in (tmp_path / "general" / "tiny_lm").iterdir()] == [path.name]
    assert json.loads((path / "train.json").read_text())["base"] == "shipped"
    ship(toy, out=tmp_path / "with_general" / "shipped")  # a card whose recipe has the stage
    card = json.loads((tmp_path / "with_general" / "shipped" / "recipe.json").read_text())
    card["recipe"] |= {"generalist_steps": 2}
    (tmp_path / "with_general" / "shipped" / "recipe.json").write_text(json.dumps(card))
    assert tiny.before_generalist_for(data, general, shipped_root=tmp_path / "with_general") is None
    # the stage's pools are the generalist's, acting by the recipe's habits: its first queries the question
    from rag_lab.train import demonstrations

    habits = tiny_habits(general)
    pools, _ = demonstrations.generalist_demonstrations(data, tmp_path / "general", 3, 6, habits)
    first = [p for p in pools["evorag"] if p.count("SEARCH:") == 0]
    assert first and all(pools["evorag"][p] == "SEARCH: " + p.split("\n")[0][10:] for p in first)


def tiny_habits(settings: dict) -> dict:
    from dataclasses import asdict

    from rag_lab.train.tiny.settings import Recipe

    return asdict(Recipe(**settings).habits)


def test_the_generalists_demonstrations_are_cached_by_its_habits(tiny_cfg, tmp_path, monkeypatch):
    """generalist_demonstrations rolls the generalist out once per world and habits (the rollouts faked:
    what they return is the habits they were asked with), and reads the cache after."""
    from rag_lab.train import demonstrations

    calls = []

    def collect(teacher, corpus, retriever, questions, k, iterations):
        calls.append(teacher.habits)
        return {"evorag": {"prompt": repr(teacher.habits)}}

    monkeypatch.setattr(demonstrations, "collect", collect)
    data = instantiate(tiny_cfg().data)
    habits = {"searches": 2, "jitter": 0.0, "verbatim": 1.0, "whole_plan": 0.6}
    first, _ = demonstrations.generalist_demonstrations(data, tmp_path, 3, 2, habits)
    again, _ = demonstrations.generalist_demonstrations(data, tmp_path, 3, 2, habits)
    other, _ = demonstrations.generalist_demonstrations(data, tmp_path, 3, 2, habits | {"verbatim": 0.0})
    assert first == again and len(calls) == 2
    assert [h.verbatim for h in calls] == [1.0, 0.0] and other["evorag"]["prompt"] == repr(calls[1])


def test_generator_tiny_loads_the_shipped_checkpoint_on_the_default_world(tmp_path, monkeypatch, caplog):
    """The shipped recipe.json matches conf/generator/tiny.yaml and the default world (data=synth at its
    shipped sizes), so generator=tiny loads the shipped model and trains nothing."""
    from rag_lab.core.config import build, compose
    from rag_lab.train.tiny import generator as tiny

    def fail(*args, **kwargs):
        raise AssertionError("trained")

    monkeypatch.setattr(tiny, "train", fail)
    cfg = compose(["generator=tiny", f"cache_dir={tmp_path}"])
    data = instantiate(cfg.data)
    with caplog.at_level("INFO"):
        generator = build(cfg.generator, data=data)
    assert Path(generator.model.name_or_path) == tiny.SHIPPED and "shipped checkpoint" in caplog.text
    # data=synth_easy keeps a selection of the same world's questions: the same shipped model
    easy = instantiate(compose(["generator=tiny", "data=synth_easy", f"cache_dir={tmp_path}"]).data)
    assert len(easy.split("train")) < len(data.split("train"))
    assert Path(build(cfg.generator, data=easy).model.name_or_path) == tiny.SHIPPED
    # the defaults before stay loadable by name, each its own shipped checkpoint (issue 64)
    for old in ("tiny_t48", "tiny_t19"):
        loaded = build(compose([f"generator={old}", f"cache_dir={tmp_path}"]).generator, data=data)
        assert Path(loaded.model.name_or_path) == tiny.SHIPPED.parent / old
    assert not (tmp_path / "tiny_lm").exists()


def test_the_vocabulary_texts_are_the_corpus_and_the_short_demonstrations():
    """vocab_demo_words: a demonstration (prompt + completion) joins the counted texts when it has at most
    that many words. By hand: "Q: a\nb" has 3 words, "xy z" 2, "Q: a b c\nd" 5."""
    from types import SimpleNamespace

    from rag_lab.data.base import Passage
    from rag_lab.train.tiny.recipe import vocabulary_texts

    page = Passage("p1", "Ada", "Ada was born in Paris.")
    data = SimpleNamespace(corpus=[page])
    chosen = {"qa": {"Q: a b c\n": "d", "Q: a\n": "b"}, "cot": {"x": "y z"}}
    assert vocabulary_texts(data, chosen, 3) == [page.contents, "Q: a\nb", "xy z"]
    assert vocabulary_texts(data, chosen, 2) == [page.contents, "xy z"]
    assert vocabulary_texts(data, chosen, 0) == [page.contents]


def test_an_unknown_tiny_lm_setting_fails_when_the_config_is_checked(tiny_cfg):
    import pytest

    from rag_lab.core.config import ConfigError

    with pytest.raises(ConfigError, match=r"generator.hiden"):
        tiny_cfg("generator=tiny", "+generator.hiden=3")


def test_reading_drills_and_renaming(tiny_cfg):
    """Drills state what their page says; renaming maps each entity consistently and keeps the
    drill answerable by reading."""
    import random

    from hydra.utils import instantiate

    from rag_lab.data.base import Passage
    from rag_lab.env.teacher.reader import answer_from
    from rag_lab.train.tiny.reading import page_facts, reading_drills, renamer

    data = instantiate(tiny_cfg().data)
    drills = reading_drills(page_facts(data))
    assert drills and all(p.startswith("Document: ") and p.endswith("\nAnswer:") for p, _ in drills)
    titles = sorted(set(data.corpus.titles))
    rename = renamer(titles)

    def parts(prompt):
        title, text, question = prompt.removeprefix("Document: ").removesuffix("\nAnswer:").split("\n")
        return title, text, question.removeprefix("Question: ")

    changed = 0
    for prompt, answer in drills[:30]:
        new_prompt, new_answer = rename((prompt, answer), random.Random(0))
        title, _, _ = parts(prompt)
        new_title, new_text, new_question = parts(new_prompt)
        assert new_title in titles and (" " in new_title) == (" " in title)
        assert new_question.count(new_title) == 1  # the question follows its page's renaming
        assert answer_from(new_question, [Passage("x", new_title, new_text)]) == new_answer.strip()
        changed += new_prompt != prompt
    assert changed > 20


def test_reading_pages_ask_every_question_of_a_page_and_shuffle_keeps_them(tiny_cfg):
    import random

    from rag_lab.train.tiny.reading import page_facts, reading_pages, shuffle_questions

    facts = page_facts(instantiate(tiny_cfg().data))
    items = reading_pages(facts)
    assert len(items) == len(facts)

    def qas(item):
        head, first = item[0].split("\nQuestion: ", 1)
        questions = [first, *(q.removeprefix("Question: ") for q in item[2::2])]
        pairs = zip(questions, item[1::2], strict=True)
        assert all(a.endswith("\n") for a in item[1::2])
        return head, sorted((q.removesuffix("\nAnswer:"), a.strip()) for q, a in pairs)

    rng = random.Random(0)
    for (page, facts_of_page), item in zip(facts[:20], items, strict=False):
        assert len(item) == 2 * len(facts_of_page) and item[0].startswith(f"Document: {page.contents}")
        head, pairs = qas(item)
        assert pairs == sorted(facts_of_page)
        shuffled = shuffle_questions(item, rng)
        assert qas(shuffled) == (head, pairs) and len(shuffled) == len(item)


def test_qa_reading_items_are_qa_prompts_whose_pages_state_every_answer(tiny_cfg):
    """The qa layout's items parse as the qa protocol (so they train the very prompts the policies
    send), hold their page and 0-2 neighbours, and each answer is what those pages state."""
    from rag_lab.env.protocols.base import identify
    from rag_lab.env.teacher.reader import answer_from
    from rag_lab.retrievers.bm25 import BM25Retriever
    from rag_lab.train.tiny.reading import page_facts, page_neighbours, qa_drills, qa_reading_item

    data = instantiate(tiny_cfg().data)
    facts = page_facts(data)
    neighbours = page_neighbours(facts, BM25Retriever(data.corpus), 4)
    assert all(i not in row and len(row) <= 4 for i, row in enumerate(neighbours))
    assert sum(len(row) == 4 for row in neighbours) > len(facts) / 2
    rng, sizes = random.Random(0), set()
    for i in range(0, len(facts), max(1, len(facts) // 60)):
        item = qa_reading_item(facts, i, neighbours, rng, max_pages=3, max_questions=6)
        protocol, state = identify(item[0])
        pages = [p for turn in state.turns for p in turn.passages]
        sizes.add(len(pages))
        assert protocol.name == "qa" and facts[i][0].title in [p.title for p in pages]
        later = [q.removeprefix("Question: ").removesuffix(protocol.tag) for q in item[2::2]]
        questions = [state.question, *later]
        assert 1 <= len(questions) <= 6 and len(item) == 2 * len(questions)
        for question, answer in zip(questions, item[1::2], strict=True):
            assert answer_from(question, pages) + protocol.stop[0] == answer
    assert sizes == {1, 2, 3}
    for prompt, answer in qa_drills(facts)[:50]:
        protocol, state = identify(prompt)
        (turn,) = state.turns
        assert protocol.name == "qa" and answer_from(state.question, turn.passages) == answer


def test_intermediate_reading_items_are_stoprag_intermediate_prompts(tiny_cfg):
    """Stop-RAG's question-first layout: each item parses as that protocol, its one document is the
    page asked about, and the answer is what the page states."""
    from rag_lab.env.protocols.base import identify
    from rag_lab.env.protocols.simple import QA
    from rag_lab.env.protocols.stoprag import StopRAGIntermediate
    from rag_lab.env.teacher.reader import answer_from
    from rag_lab.train.tiny.reading import STOP, intermediate_drills, intermediate_reading_item, page_facts

    facts = page_facts(instantiate(tiny_cfg().data))
    rng = random.Random(0)
    items = [intermediate_reading_item(facts, i, rng) for i in range(0, len(facts), max(1, len(facts) // 60))]
    assert QA.stop == StopRAGIntermediate.stop == (STOP,)  # the stop every reading layout ends with
    assert all(answer.endswith(STOP) for _, answer in items)
    for prompt, answer in items + intermediate_drills(facts)[:50]:
        protocol, state = identify(prompt)
        (turn,) = state.turns
        assert protocol.name == "stoprag_intermediate" and len(turn.passages) == 1
        assert answer_from(turn.action.query, turn.passages) == answer.removesuffix(STOP)


def test_the_reading_stage_and_typed_renaming_run_from_the_config(tiny_cfg, tmp_path):
    import json

    from rag_lab.train.tiny.reading import page_facts, page_kinds, renamer

    cfg = tiny_cfg("generator=tiny", f"cache_dir={tmp_path}", "generator.reading_steps=3",
                   "generator.reading_batch_size=2", "generator.rename_entities=true",
                   "generator.reading_layout=[qa,stoprag_intermediate,drill]",
                   "generator.drills=true", "generator.name_pieces=false")  # fmt: skip
    data = instantiate(cfg.data)
    generator = instantiate(cfg.generator, data=data)
    checkpoint = Path(generator.model.name_or_path)
    stats = json.loads((checkpoint / "train.json").read_text())
    if "base" in stats:  # the protocol stage's model: the stages before it are its base's
        checkpoint = tmp_path / "tiny_lm" / stats["base"]
        stats = json.loads((checkpoint / "train.json").read_text())
    # name_pieces=false: a multi-word name is its words, one token each
    tokenizer = AutoTokenizer.from_pretrained(checkpoint / "tokenizer")
    name = next(t for t in data.corpus.titles if " " in t)
    assert tokenizer.tokenize(name) == name.split()
    assert stats["reading"]["steps"] == 3 and stats["sft"]["steps"] >= 1
    # Drills of the three layouts in SFT: three per fact.
    n_facts = sum(len(qas) for _, qas in page_facts(data))
    assert stats["pairs"] >= 3 * n_facts
    kinds = page_kinds(page_facts(data))
    assert {"birthplace", "director", "capital"} <= set(kinds.values())
    rename = renamer(sorted(kinds), kinds)
    for title in list(kinds)[:50]:
        (new,) = rename((title,), random.Random(0))
        assert kinds[new] == kinds[title] and (" " in new) == (" " in title)


def test_an_unknown_reading_layout_is_a_one_line_error(tiny_cfg, tmp_path):
    import pytest

    from rag_lab.core.errors import RagLabError
    from rag_lab.train.tiny.recipe import train

    with pytest.raises(RagLabError, match=r"generator.reading_layout: 'page' is not one of drill, qa, stop"):
        train(instantiate(tiny_cfg().data), str(tmp_path), reading_layout=["qa", "page"])


def test_a_named_demos_layout_draws_that_protocols_demonstrations_only():
    """``demos:<protocol>`` weights a protocol in the reading stage; plain ``demos`` takes a random one
    per batch; every batch holds one protocol's items."""
    from rag_lab.train.tiny.reading import draw_reading

    pools = {"a": [(f"a{i} ", "x") for i in range(5)], "b": [(f"b{i} ", "y") for i in range(5)]}

    def keep(item, rng):
        return item

    def protocols_of(layouts, steps):
        items = draw_reading(layouts, steps, 4, {}, pools, keep, random.Random(0), 0)
        batches = [items[i : i + 4] for i in range(0, len(items), 4)]
        return [{prompt[0] for prompt, _ in batch} for batch in batches]

    assert protocols_of(["demos:b"], 6) == [{"b"}] * 6
    mixed = protocols_of(["demos:a", "demos"], 40)
    assert all(len(kinds) == 1 for kinds in mixed)
    assert sum(kinds == {"a"} for kinds in mixed) > 20 and {"b"} in mixed


def test_the_protocol_stage_trains_on_the_cached_model_and_is_cached_apart(tiny_cfg, tmp_path):
    """tune_steps: the model before the stage is trained (or reused) under its own hash, the stage's
    model under another; a second run reuses both, and a changed stage reuses the base."""
    import json

    base = ("generator=tiny", f"cache_dir={tmp_path}", "generator.protocols=[qa,stoprag_query]")
    stage = ("generator.tune_steps=2", "generator.reading_batch_size=2",
             "generator.tune_layout=[demos:stoprag_query,qa]")  # fmt: skip
    data = instantiate(tiny_cfg(*base).data)
    first = instantiate(tiny_cfg(*base, *stage).generator, data=data)
    models = {p.name: p for p in (tmp_path / "tiny_lm").iterdir()}
    assert len(models) == 2
    tuned = json.loads((Path(first.model.name_or_path) / "train.json").read_text())
    assert tuned["base"] in models and tuned["tune"]["steps"] == 2
    assert tuned["total_wall_s"] == tuned["base_wall_s"] + tuned["wall_s"]
    again = instantiate(tiny_cfg(*base, *stage).generator, data=data)
    assert again.model.name_or_path == first.model.name_or_path
    instantiate(tiny_cfg(*base, *stage, "generator.tune_lr=0.01").generator, data=data)
    assert len(list((tmp_path / "tiny_lm").iterdir())) == 3  # the base was reused


def test_protocol_stage_demonstrations_end_with_their_protocols_stop():
    from rag_lab.train.tiny.reading import draw_reading

    pools = {"stoprag_query": [("Main question: q\n[stoprag_query]\n", "Who is x?")],
             "stoprag_decide": [("p", "ok <STOP>")], "apex_plan": [("plan", "1. Who is x?")]}  # fmt: skip
    items = draw_reading(["demos:stoprag_query", "demos:stoprag_decide", "demos:apex_plan"], 3, 1, {}, pools,
                         lambda item, rng: item, random.Random(0), 0, stops=True)  # fmt: skip
    # decide keeps its stop in the text; a plan has no stop string and ends with EOS
    assert sorted(c for _, c in items) == ["1. Who is x?<eos>", "Who is x?\n", "ok <STOP>"]
    plain = draw_reading(["demos:stoprag_query"], 1, 1, {}, pools, lambda i, r: i, random.Random(0), 0)
    assert plain[0][1] == "Who is x?"


def test_a_named_demos_layout_must_name_a_chosen_protocol(tiny_cfg, tmp_path):
    import pytest

    from rag_lab.core.errors import RagLabError
    from rag_lab.train.tiny.recipe import train

    data = instantiate(tiny_cfg().data)
    with pytest.raises(RagLabError, match=r"'demos:qa' names a protocol that generator.protocols \(cot\)"):
        train(data, str(tmp_path), reading_layout=["demos:qa"], protocols=["cot"])
    with pytest.raises(RagLabError, match=r"generator.tune_layout: 'demos:stoprag_quary' names no protocol"):
        train(data, str(tmp_path), tune_steps=1, tune_layout=["demos:stoprag_quary"])
    with pytest.raises(RagLabError, match=r"'qa:cot' is not one of drill, qa"):
        train(data, str(tmp_path), reading_layout=["qa:cot"])


def test_reading_batches_are_regrouped_by_length_within_their_kind():
    """group_by_length keeps every batch's kind and size and each kind's items; within a window of
    one kind the batches are length-sorted slices of the window's items, handed out in random order."""
    from rag_lab.train.tiny.reading import group_by_length

    rng = random.Random(0)
    kinds = ["qa", "demos:0", "qa", "demos:1"] * 5
    batches = [(k, [(k, "x" * rng.randrange(1, 400)) for _ in range(4)]) for k in kinds]
    out = group_by_length(batches, random.Random(0), window=3)
    assert [len(items) for items in out] == [4] * len(kinds)
    for kind in set(kinds):
        steps = [s for s, k in enumerate(kinds) if k == kind]
        assert sorted(x for s in steps for x in out[s]) == sorted(x for s in steps for x in batches[s][1])
        for start in range(0, len(steps), 3):
            groups = sorted(sorted(len(x[1]) for x in out[s]) for s in steps[start : start + 3])
            assert all(a[-1] <= b[0] for a, b in zip(groups, groups[1:], strict=False))
    lengths = [max(len(x[1]) for x in items) for items in out]
    assert sum(lengths) < sum(max(len(x[1]) for x in items) for _, items in batches)
    assert out == group_by_length(batches, random.Random(0), window=3)  # seeded
