"""The tiny LM's machinery: an exact word-level tokenizer whose ids follow the counts, prompts cut from
the left, the SFT loss on completion tokens only, the reading loss, and train -> publish -> reuse -> load
in ``HFGenerator``."""

import json
import math
from dataclasses import asdict, replace
from itertools import chain

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

from rag_lab.core.errors import RagLabError
from rag_lab.generators.base import Sampling
from rag_lab.train.sft import sft_dataset
from rag_lab.train.tiny import model as tiny
from rag_lab.train.tiny import trainer
from rag_lab.train.tiny.model import TinyConfig, build_model, reading_example, sft_trainer
from rag_lab.train.tiny.tokenizer import build_tokenizer
from rag_lab.train.tiny.trainer import train_tiny_lm

TAGS = ["<search>", "</search>", "<information>", "</information>", "<answer>", "</answer>"]
TEXTS = [
    "Zorbu Kaltane was born in Velmora, Dravia.",
    "Velmora is a city in Dravia.\n\nIt has  two spaces: #1 and #2?",
    "Kessa Tolvane directed Glimmer Road (1987).",
]
INFO = "\n<information>\nZorbu Kaltane was born in Velmora, Dravia.\n</information>\n"
PAIRS = [
    ("Question: Where was Zorbu Kaltane born?\n", "<search>Zorbu Kaltane</search>"),
    (
        "Question: Where was Zorbu Kaltane born?\n<search>Zorbu Kaltane</search>" + INFO,
        "<answer>Velmora</answer>",
    ),
    ("Question: Who directed Glimmer Road?\n", "<search>Glimmer Road</search>"),
]
# max_length 32 cuts the second pair (40 prompt + 4 completion tokens) in the end-to-end run.
TINY = TinyConfig(hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64, max_length=32, sft_steps=4,
                  batch_size=2, lr=1e-2, warmup_steps=1)  # fmt: skip


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer([*TEXTS, *chain.from_iterable(PAIRS)], TAGS)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return train_tiny_lm(TEXTS, PAIRS, TINY, tmp_path_factory.mktemp("tiny") / "lm", special_tokens=TAGS)


def test_tokenizer_round_trips_exactly_also_after_saving(tok, tmp_path):
    tok.save_pretrained(tmp_path / "tokenizer")
    for t in (tok, AutoTokenizer.from_pretrained(tmp_path / "tokenizer")):
        for text in [*TEXTS, *(prompt + completion for prompt, completion in PAIRS)]:
            ids = t(text).input_ids
            assert t.decode(ids) == text
            # Tags are normal tokens: skip_special_tokens drops only pad / eos / unk.
            assert t.decode(ids + [t.eos_token_id, t.pad_token_id], skip_special_tokens=True) == text
        # No BOS, no EOS added by the tokenizer.
        assert t("Velmora").input_ids == [t.convert_tokens_to_ids("Velmora")]


def test_words_tags_punctuation_and_whitespace_are_single_tokens(tok):
    ids = tok("x <search>Zorbu Kaltane</search>\n\nZorbu, Zorbu  #1?").input_ids
    # A single space between two words is no token (the decoder restores it); every other one is.
    assert tok.convert_ids_to_tokens(ids) == [
        "<unk>", " ", "<search>", "Zorbu", "Kaltane", "</search>", "\n", "\n",
        "Zorbu", ",", " ", "Zorbu", " ", " ", "#", "1", "?",
    ]  # fmt: skip
    assert ids[0] == tok.unk_token_id
    assert set(tok.all_special_tokens) == {"<pad>", "<eos>", "<unk>"}
    with pytest.raises(RagLabError, match="U\\+E000"):
        build_tokenizer(["a\ue000b"])


def test_ids_follow_the_counts_after_the_specials_and_tags():
    """Token ids are ordered by frequency (ties by the piece), so every text counted, even one that trains
    nothing (the recipe's vocab_demo_words), decides the ids. Counted by hand: "b a c c" and "a b c"
    give c 3, a 2, b 2 (a single space between words is no token); one more "b b" makes b 4."""
    tok = build_tokenizer(["b a c c", "a b c"], ["<t>"])
    tokens = tok.convert_ids_to_tokens(list(range(len(tok))))
    assert tokens == ["<pad>", "<eos>", "<unk>", "<t>", "c", "a", "b"]
    tok = build_tokenizer(["b a c c", "a b c", "b b"], ["<t>"])
    assert tok.convert_ids_to_tokens(list(range(4, len(tok)))) == ["b", "c", "a"]


def test_name_pieces_cut_names_into_syllables_and_still_round_trip(tmp_path):
    names = {"Zorbu", "Kaltane", "Velmora", "Dravia", "Kessa", "Tolvane"}
    tok = build_tokenizer([*TEXTS, *chain.from_iterable(PAIRS)], TAGS, pieces=names)
    tok.save_pretrained(tmp_path / "tokenizer")
    for t in (tok, AutoTokenizer.from_pretrained(tmp_path / "tokenizer")):
        ids = t("<search>Zorbu Kaltane</search> was born in Velmora, Dravia.\n").input_ids
        assert t.convert_ids_to_tokens(ids) == [
            "<search>", "Zo", "##rbu", "Ka", "##lta", "##ne", "</search>", " ", "was", "born", "in",
            "Ve", "##lmo", "##ra", ",", " ", "Dra", "##via", ".", "\n",
        ]  # fmt: skip
        for text in [*TEXTS, *(prompt + completion for prompt, completion in PAIRS)]:
            assert t.decode(t(text).input_ids) == text
        # A name never seen is cut into letters, not <unk>; a word that is not a name stays whole.
        assert t.tokenize("Tolvessa") == ["To", "##l", "##v", "##e", "##ssa"]
        assert t.decode(t("Tolvessa").input_ids) == "Tolvessa" and t.tokenize("directed") == ["directed"]
    assert "Zorbu" not in tok.get_vocab()


def test_a_text_tokenizes_as_its_parts_except_inside_a_word_space_word_run(tok):
    for prompt, completion in PAIRS:
        assert tok(prompt + completion).input_ids == tok(prompt).input_ids + tok(completion).input_ids
    # The seam: alone, " Kaltane" keeps its space as a token; after "Zorbu" the space is implicit.
    apart = tok("Zorbu").input_ids + tok(" Kaltane").input_ids
    assert len(apart) == len(tok("Zorbu Kaltane").input_ids) + 1
    assert tok.decode(apart) == "Zorbu Kaltane"


def test_sft_rows_cut_the_prompt_from_the_left_and_keep_the_completion(tok):
    prompt, completion = PAIRS[1]
    p = tok(prompt).input_ids
    c = tok(completion).input_ids + [tok.eos_token_id]
    row = sft_dataset([(prompt, completion)], tok, max_length=len(c) + 5)[0]
    assert row["input_ids"] == p[-5:] + c
    assert row["completion_mask"] == [0] * 5 + [1] * len(c)
    # Fits as is; a completion that already ends with EOS gets no second one.
    row = sft_dataset([(prompt, completion + "<eos>")], tok, max_length=1024)[0]
    assert row["input_ids"] == p + c
    with pytest.raises(RagLabError, match="completion 0"):
        sft_dataset([(prompt, completion)], tok, max_length=len(c))


def test_sft_loss_is_on_completion_tokens_only(tok, tmp_path):
    config = replace(TINY, max_length=1024)
    model = build_model(tok, config)
    trainer = sft_trainer(
        model, tok, sft_dataset(PAIRS, tok, config.max_length), config, tmp_path / "trainer"
    )
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(PAIRS))])
    completion = torch.zeros_like(batch["input_ids"], dtype=torch.bool)
    for i, (prompt, text) in enumerate(PAIRS):
        start, c = len(tok(prompt).input_ids), tok(text).input_ids + [tok.eos_token_id]
        labels = batch["labels"][i].tolist()
        assert labels == [-100] * start + c + [-100] * (len(labels) - start - len(c))
        completion[i, start : start + len(c)] = True
    # TRL's loss is the mean next-token loss over the completion tokens, computed by hand here.
    model.train()  # the trainer put the model on its device: the batch goes there, the numbers come back
    on_device = {k: v.to(model.device) for k, v in batch.items()}
    loss = trainer.compute_loss(model, on_device).item()
    with torch.no_grad():
        logits = model(input_ids=on_device["input_ids"], attention_mask=on_device["attention_mask"]).logits
    logits, ids = logits.float().cpu(), batch["input_ids"]
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    assert loss == pytest.approx(nll[completion[:, 1:]].mean().item(), rel=1e-5)
    assert loss != pytest.approx(nll[batch["attention_mask"][:, 1:].bool()].mean().item(), rel=1e-3)


def test_train_tiny_lm_publishes_a_model_hf_generator_loads(trained):
    from rag_lab.generators.hf import HFGenerator

    assert sorted(p.name for p in trained.parent.iterdir()) == ["lm"]  # no temp dir left behind
    assert {"model.safetensors", "config.json", "tokenizer", "train.json"} <= {
        p.name for p in trained.iterdir()
    }
    stats = json.loads((trained / "train.json").read_text())
    assert stats["config"] == asdict(TINY) and "reading" not in stats
    assert stats["sft"]["steps"] == TINY.sft_steps
    assert all(math.isfinite(stats["sft"][k]) for k in ("final_loss", "tokens_per_s"))
    assert stats["sft"]["max_length"] == TINY.max_length  # the second pair was cut to fit
    weights = load_file(trained / "model.safetensors")
    tokenizer = AutoTokenizer.from_pretrained(trained / "tokenizer")
    init = build_model(tokenizer, TINY).state_dict()
    assert stats["parameters"] == sum(w.numel() for w in weights.values())
    assert all(not torch.equal(w, init[name]) for name, w in weights.items())  # every tensor trained

    generator = HFGenerator(model=str(trained), tokenizer=str(trained / "tokenizer"))
    [[out]] = generator.generate([PAIRS[0][0]], Sampling(max_new_tokens=6))
    assert 1 <= len(out.token_ids) <= 6
    assert out.text == tokenizer.decode(out.token_ids, skip_special_tokens=True)


def test_a_published_model_is_reused_never_retrained(trained, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("retrained")

    monkeypatch.setattr(trainer, "build_tokenizer", fail)
    assert train_tiny_lm(TEXTS, PAIRS, TINY, trained, special_tokens=TAGS) == trained
    with pytest.raises(RagLabError, match="another config or data"):
        train_tiny_lm(TEXTS, PAIRS, replace(TINY, seed=1), trained, special_tokens=TAGS)
    with pytest.raises(RagLabError, match="another config or data"):
        train_tiny_lm(TEXTS[:2], PAIRS, TINY, trained, special_tokens=TAGS)


def test_same_seed_same_weights(trained, tmp_path):
    again = train_tiny_lm(TEXTS, PAIRS, TINY, tmp_path / "again", special_tokens=TAGS)
    first, second = load_file(trained / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)


def test_a_failed_training_leaves_nothing(tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(trainer, "sft_stage", crash)
    with pytest.raises(RuntimeError, match="killed"):
        train_tiny_lm(TEXTS, PAIRS, TINY, tmp_path / "lm", special_tokens=TAGS)
    assert list(tmp_path.iterdir()) == []


def test_a_reading_item_has_labels_on_its_answers_only():
    item = ("Document: Glimmer Road is a film.\nQuestion: What is Glimmer Road?\nAnswer:", " a film",
            "\nQuestion: Is Glimmer Road a film?\nAnswer:", " yes")  # fmt: skip
    tok = build_tokenizer([*TEXTS, *item], TAGS)
    ids, labels = reading_example(tok, item, 1024)
    assert tok.decode(ids) == "".join(item)
    assert tok.decode([t for t in labels if t != -100]) == " a film yes"
    assert all(label in (-100, t) for t, label in zip(ids, labels, strict=True))
    ids, labels = reading_example(tok, item, 5)  # cut from the left: the last answer stays
    assert len(ids) == 5 and tok.decode(ids).endswith("Answer: yes") and labels[-1] == ids[-1]


def test_an_entity_is_a_reading_target_only_where_it_repeats():
    """A first mention cannot be read from anything; a repeat (also one in the answer) can."""
    item = ("", "Glimmer Road: Zorbu directed Glimmer Road.\nAnswer:", "", " Zorbu")
    tok = build_tokenizer([*TEXTS, *item], TAGS)
    entities = {tok.convert_tokens_to_ids(name) for name in ("Glimmer", "Zorbu")}
    ids, labels = reading_example(tok, item, 1024, entities)
    targets = [
        (tok.decode([t]), label != -100) for t, label in zip(ids, labels, strict=True) if t in entities
    ]
    assert targets == [("Glimmer", False), ("Zorbu", False), ("Glimmer", True), ("Zorbu", True)]
    # Cut from the left so that the earlier mention is gone: the answer has nothing to copy from.
    ids, labels = reading_example(tok, item, 6, entities)
    assert tok.decode(ids) == ".\nAnswer: Zorbu" and labels[-1] == -100 and labels[:-1] == ids[:-1]
    # Without entities every token of the two labelled pieces is a target.
    ids, labels = reading_example(tok, item, 1024)
    assert labels == ids


def test_the_reading_stage_trains_on_its_own_items_with_the_answer_only_loss(tmp_path):
    page = "Document:\nGlimmer Road: Glimmer Road is a film by Zorbu Kaltane."
    reading = [(f"{page}\nQuestion: Who directed Glimmer Road?\nAnswer:", " Zorbu Kaltane")] * 6
    config = replace(TINY, reading_steps=3, reading_batch_size=2)
    out = train_tiny_lm(TEXTS, PAIRS, config, tmp_path / "lm", special_tokens=TAGS, reading=reading)
    stats = json.loads((out / "train.json").read_text())
    assert [stats[stage]["steps"] for stage in ("reading", "sft")] == [3, 4]
    assert math.isfinite(stats["reading"]["final_loss"])
    with pytest.raises(RagLabError, match="reading_steps needs reading items"):
        train_tiny_lm(TEXTS, PAIRS, config, tmp_path / "other", special_tokens=TAGS)
    with pytest.raises(RagLabError, match="3 reading steps of 2 need 6 items, got 5"):
        train_tiny_lm(TEXTS, PAIRS, config, tmp_path / "other", special_tokens=TAGS, reading=reading[:5])
    # the reading items are part of the data a cached model is checked against
    with pytest.raises(RagLabError, match="another config or data"):
        train_tiny_lm(TEXTS, PAIRS, config, out, special_tokens=TAGS, reading=reading[:2])


def test_the_loss_on_labelled_positions_only_equals_the_models_own_loss_and_gradient(tok):
    """``tiny.target_loss`` applies the LM head where there are labels only; loss and gradients are the
    model's own (``model(**batch).loss``) on a padded reading batch with answer-only labels."""
    items = [
        ("Document: Zorbu Kaltane was born in Velmora.\nQuestion: Where?\nAnswer:", " Velmora"),
        ("Kessa Tolvane directed Glimmer Road.\nQ:", " Kessa Tolvane", "\nQ:", " Glimmer Road"),
    ]
    tok = build_tokenizer([*TEXTS, *chain.from_iterable(items)], TAGS)
    batch = tiny.reading_batch(tok, items, 1024)
    assert (batch["labels"] != -100).sum() == 8 and (batch["attention_mask"] == 0).any()
    grads = []
    for loss_of in (lambda m: m(**batch).loss, lambda m: tiny.target_loss(m, batch)):
        model = build_model(tok, TINY)
        loss = loss_of(model)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (expected, want), (got, have) = grads
    torch.testing.assert_close(got, expected)
    for a, b in zip(have, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_the_trie_pattern_matches_what_the_longest_first_alternation_matches():
    """Renaming's regex (``trie_pattern``) takes the longest word at each place that the word boundary
    allows, as the alternation of the words longest first does: prefixes, shared starts, multi-word names."""
    import re

    from rag_lab.train.tiny.reading import trie_pattern

    words = ["Ab", "Ab Cd", "Ab Cde", "Abc", "B", "Bo Ra", "Bo"]
    alternation = re.compile(r"\b(" + "|".join(map(re.escape, sorted(words, key=len, reverse=True))) + r")\b")
    trie = re.compile(r"\b(" + trie_pattern(words) + r")\b")
    for text in ["Ab Cdx Ab Cde Abc Ab B Abcd", "Ab Cd.", "xAb Ab, Ab Cde!", "Bo Ra Bo Rax Bo", "Abc Cd"]:
        want = [(m.start(), m.group(0)) for m in alternation.finditer(text)]
        assert [(m.start(), m.group(0)) for m in trie.finditer(text)] == want, text
    assert [m.group(0) for m in trie.finditer("Ab Cdx Ab Cde Abc")] == ["Ab", "Ab Cde", "Abc"]


def test_a_reading_batch_holds_each_items_own_example():
    """``reading_batch`` tokenizes a batch's pieces in one call: each row is ``reading_example`` of its
    item (ids and labels), padded; the worker-built batches are the same."""
    items = [
        ("Document: Zorbu Kaltane was born in Velmora.\nQuestion: Where?\nAnswer:", " Velmora"),
        ("Kessa Tolvane directed Glimmer Road.\nQ:", " Kessa Tolvane", "\nQ:", " Glimmer Road"),
        ("Velmora.\nQ:", " Zorbu"),
    ]
    tok = build_tokenizer([*TEXTS, *chain.from_iterable(items)], TAGS)
    batch = tiny.reading_batch(tok, items, 1024)
    for row, item in enumerate(items):
        ids, labels = reading_example(tok, item, 1024)
        assert batch["input_ids"][row, : len(ids)].tolist() == ids
        assert batch["labels"][row, : len(ids)].tolist() == labels
        assert int(batch["attention_mask"][row].sum()) == len(ids)
    loaded = list(torch.utils.data.DataLoader(tiny._ReadingBatches(tok, items * 2, 3, 1024, frozenset()),
                                              batch_size=None, num_workers=0))  # fmt: skip
    assert len(loaded) == 2 and all(torch.equal(b["input_ids"], batch["input_ids"]) for b in loaded)
