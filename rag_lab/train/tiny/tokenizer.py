"""The tiny LM's tokenizer: word-level (every word one token, or a name's syllables), with an exact
round trip.

Hand-written, and why: ``tokenizers`` has the parts but no recipe for a word-level tokenizer that keeps
every invented word one token AND decodes back to the exact text. Here a regex ``Split`` makes each
word (``\\w+``), each punctuation character and each whitespace character a token of its own, except
a single space between two words, which is dropped; the decoder joins the tokens and puts a space
back between two word tokens in a row. So ``decode(encode(t)) == t`` for every text built from known
words, and a word is the same token wherever it stands (after a space, a newline, ``<search>``):
copying a name from a passage into a query or an answer is copying one token id. GPT-2-style
``" word"`` tokens would give each word two ids ("Ada" / " Ada") that the model must learn are one;
a separate token for every space would cost 1.65x more tokens (this scheme: 1.12x GPT-2's, on the
synth world's passages). The one seam: ``encode(a + b) == encode(a) + encode(b)`` except where ``a``
ends in a word and ``b`` starts with a word or with a space and a word. Tags (``special_tokens``)
are normal added tokens, so ``skip_special_tokens`` keeps them; only ``<pad>``, ``<eos>``, ``<unk>``
are special. There is no BOS. With ``pieces`` (the world's names) the model is ``tokenizers``'
WordPiece over the same vocabulary plus each name's syllables (``Lia ##kria ##burg``), and the
decoder joins a ``##`` piece to the token before it with no space.
"""

import re
from collections import Counter
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING

from rag_lab.core.errors import RagLabError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


SPECIAL = ("<pad>", "<eos>", "<unk>")
# One token per word, per punctuation character, per whitespace character ...
PIECES = r"\w+|[^\w\s]|\s"
# ... except a single space between two words, which the decoder puts back.
WORD_SPACE = r"(?<=\w) (?=\w)"
# Private-use characters that mark word tokens (and a name's later pieces) while decoding; a text must not
# contain them.
WORD_START, WORD_END, WORD_GOES_ON = "\ue000", "\ue001", "\ue002"
# A name's pieces (build_tokenizer's ``pieces``): each run of consonants with the vowels after it, the last
# with the consonants that end the word ("Liakriaburg" -> Lia, kria, burg).
SYLLABLE = re.compile(r"[^aeiouy]*[aeiouy]+(?:[^aeiouy]+$)?|[^aeiouy]+$", re.IGNORECASE)
# The mark of a piece that continues a word (WordPiece's): "Lia", "##kria", "##burg".
GOES_ON = "##"


def syllables(word: str) -> list[str]:
    """``word`` cut into its :data:`SYLLABLE` pieces, the later ones marked as going on (``##``)."""
    return [p if i == 0 else GOES_ON + p for i, p in enumerate(SYLLABLE.findall(word))]


def build_tokenizer(
    texts: Iterable[str], special_tokens: Sequence[str] = (), pieces: Collection[str] = ()
) -> "PreTrainedTokenizerFast":
    """A word-level ``PreTrainedTokenizerFast`` over every piece of ``texts``; unseen words -> ``<unk>``.

    Ids: ``<pad>`` 0, ``<eos>`` 1, ``<unk>`` 2, then ``special_tokens`` (single tokens wherever they
    stand, kept by ``skip_special_tokens``), then the pieces by frequency (:func:`vocabulary`).

    ``pieces``: words (the world's names) that are never tokens of their own but their syllables
    (:func:`syllables`: Lia ##kria ##burg), WordPiece-style: a word in the vocabulary is one token, any
    other is cut greedily into the longest pieces the vocabulary has (every letter is one, so no name
    becomes ``<unk>``). A name is then a few frequent tokens, each trained in many names, and copying
    it is copying a short sequence, where a rare one-token name's embedding is trained in a few
    contexts only (the recipe's ``name_pieces``).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tags = [t for t in dict.fromkeys(special_tokens) if t not in SPECIAL]
    split = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(WORD_SPACE), behavior="removed"),
            pre_tokenizers.Split(Regex(PIECES), behavior="isolated"),
        ]
    )
    vocab = vocabulary(count_pieces(texts, split, tags), tags, pieces)
    if pieces:
        model = models.WordPiece(vocab, unk_token="<unk>", continuing_subword_prefix=GOES_ON)
    else:
        model = models.WordLevel(vocab, unk_token="<unk>")
    tok = Tokenizer(model)
    tok.pre_tokenizer = split
    tok.decoder = decoder()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in tags])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        # transformers' clean-up would turn " ." into "." and break the exact round trip
        clean_up_tokenization_spaces=False,
    )


def count_pieces(texts: Iterable[str], split, tags: Sequence[str]) -> Counter[str]:
    """How often each piece of ``texts`` occurs, as the tokenizer cuts them (``split``, its
    pre-tokenizer): the added tokens (specials and ``tags``) are matched first, then the words between
    them are split."""
    added = re.compile("|".join(re.escape(t) for t in sorted([*SPECIAL, *tags], key=len, reverse=True)))
    counts: Counter[str] = Counter()
    for text in texts:
        if WORD_START in text or WORD_END in text or WORD_GOES_ON in text:
            raise RagLabError(
                f"tiny LM: a text holds U+E000, U+E001 or U+E002, which the decoder reserves: {text!r}"
            )
        counts.update(piece for part in added.split(text) for piece, _ in split.pre_tokenize_str(part))
    return counts


def vocabulary(counts: Counter[str], tags: Sequence[str], pieces: Collection[str] = ()) -> dict[str, int]:
    """token -> id: the specials, the ``tags``, then every piece by falling frequency (ties by the
    piece), with each word of ``pieces`` replaced by its syllables and, so that any name can be
    spelled, its letters (the first as a word start, the others as ``##`` pieces)."""
    counts = Counter(counts)
    letters: Counter[str] = Counter()
    for word in [w for w in counts if w in pieces]:
        n = counts.pop(word)
        counts.update({p: n for p in syllables(word)})
        letters.update(word[:1])
        letters.update(GOES_ON + c for c in word[1:])
    vocab = {token: i for i, token in enumerate([*SPECIAL, *tags])}
    for piece, _ in sorted((counts + letters).items(), key=lambda kv: (-kv[1], kv[0])):
        vocab.setdefault(piece, len(vocab))
    return vocab


def decoder():
    """The decoder that undoes the split: it marks where word tokens start and end (and a name's later
    piece: that it goes on a word), joins every token as it is, then turns "end, start" (two words in
    a row) back into the space the split removed, and "end, goes on" into nothing."""
    from tokenizers import Regex, decoders

    return decoders.Sequence(
        [
            decoders.Replace(Regex("^" + re.escape(GOES_ON)), WORD_GOES_ON),
            decoders.Replace(Regex(r"^(?=\w)"), WORD_START),
            decoders.Replace(Regex(r"(?<=\w)$"), WORD_END),
            decoders.Fuse(),
            decoders.Replace(WORD_END + WORD_START, " "),
            decoders.Replace(WORD_END + WORD_GOES_ON, ""),
            decoders.Replace(WORD_END, ""),
            decoders.Replace(WORD_START, ""),
            decoders.Replace(WORD_GOES_ON, ""),
        ]
    )


def one_token_names(tokenizer: "PreTrainedTokenizerFast", entities: Sequence[str]) -> set[int]:
    """The ids of the world's names that are one known token (reading targets only where they repeat)."""
    ids = tokenizer(list(entities), add_special_tokens=False).input_ids if entities else []
    return {i[0] for i in ids if len(i) == 1 and i[0] != tokenizer.unk_token_id}
