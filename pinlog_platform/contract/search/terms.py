"""The lexical index's terms (docs/search.md "Lexical"): a note's or a query's content lemmas
(``pinlog_platform.korean_lemmas``: nouns, verb and adjective stems, roots, content adverbs,
foreign words; never endings or particles) less a short stoplist, with their counts.

The stoplist holds the stems so common in notes that they say nothing of what a note is about;
docs/search.md lists it. ``ANALYSER_VERSION`` names the analyser, its model and these rules: a
context whose terms carry another version is refreshed by ``pinlog-core reindex search``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version

from pinlog_platform.korean_lemmas import shared_analyser

STOPLIST = frozenset({"하다", "되다", "있다", "좋다", "같다", "보다", "가다", "오다"})
TERM_MAX_CHARACTERS = 64  # core.context_search_term.term
TERMS_REVISION = "t2"
_HADA = "하다"
ANALYSER_VERSION = (
    f"kiwipiepy-{version('kiwipiepy')}+model-{version('kiwipiepy_model')}/{TERMS_REVISION}"
)


@dataclass(frozen=True, slots=True)
class Terms:
    """Distinct terms (sorted) with their counts; ``length``: all terms counted (BM25's
    document length)."""

    terms: tuple[str, ...]
    counts: tuple[int, ...]

    @property
    def length(self) -> int:
        return sum(self.counts)


def _with_roots(lemmas: list[str]) -> Iterator[str]:
    """Each lemma, and after a ``X하다`` stem its root ``X``: Kiwi reads "아늑한" in a sentence
    as the root 아늑 with a suffix, but typed alone (a one-word query) as the adjective 아늑하다;
    both must meet on the root. One-syllable roots (편하다 -> 편) are too ambiguous to add."""
    for lemma in lemmas:
        yield lemma
        if lemma.endswith(_HADA) and len(lemma) > len(_HADA) + 1:
            yield lemma[: -len(_HADA)]


def analyse(text: str) -> Terms:
    """The terms of ``text`` (CPU-bound, about a millisecond a note: call it off an event
    loop)."""
    counted = Counter(
        term[:TERM_MAX_CHARACTERS]
        for term in _with_roots(shared_analyser().lemmas(text))
        if term not in STOPLIST
    )
    ordered = sorted(counted)
    return Terms(tuple(ordered), tuple(counted[term] for term in ordered))


def query_terms(text: str) -> list[str]:
    """The distinct terms of a query."""
    return list(analyse(text).terms)
