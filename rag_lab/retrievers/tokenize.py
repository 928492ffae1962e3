"""One tokenizer for every sparse backend: lower-casing, optional stop words and stemming.

The token pattern is bm25s's (words of two or more word characters); stop words come from
bm25s's lists, stemming from PyStemmer (Snowball), memoised per word.
"""

import re
from functools import cache

from bm25s import stopwords as bm25s_stopwords

from rag_lab.core.errors import RagLabError

TOKEN = re.compile(r"(?u)\b\w\w+\b")


class Tokenizer:
    def __init__(self, lower: bool = True, stopwords: str | None = "en", stemmer: str | None = None):
        self.lower = lower
        name = {"en": "STOPWORDS_EN", "en_plus": "STOPWORDS_EN_PLUS"}.get(stopwords or "", "")
        if stopwords and not name:
            raise RagLabError(
                f"retriever.stopwords: unknown stop-word list '{stopwords}' (use en, en_plus or null)"
            )
        self.stop = frozenset(getattr(bm25s_stopwords, name)) if name else frozenset()
        self.stem = None
        if stemmer:
            import Stemmer

            stem_word = Stemmer.Stemmer(stemmer).stemWord
            self.stem = cache(stem_word)

    def __call__(self, text: str) -> list[str]:
        """
        >>> Tokenizer(stemmer="english")("The Directors of A Film directed it")
        ['director', 'film', 'direct']
        """
        words = TOKEN.findall(text.lower() if self.lower else text)
        words = [w for w in words if w not in self.stop]
        return [self.stem(w) for w in words] if self.stem else words
