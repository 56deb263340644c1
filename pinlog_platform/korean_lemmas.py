"""Content lemmas of Korean text with negation marks, by the Kiwi morphological analyser.

One analyser per process (:func:`shared_analyser`), loaded once, lazily or at startup
(:meth:`KoreanLemmatizer.load`): the model takes seconds and about 300 MiB (figures in
docs/offline-encoder.md), so only the code that uses it imports this module's analyser; a
worker whose judge does not read words never loads it. Calls are thread-safe (a lock around the
load and around each analysis); they block for about a millisecond per short note, so callers
on an event loop run them in a worker thread.

Lemma shapes (``Lemma.form``):

- nouns (``NNG``, ``NNP``) as written: "라떼", "위로", "콘센트";
- verb and adjective stems with "다": "맛있음" -> "맛있다", "예뻐요" -> "예쁘다";
- roots (``XR``) as the root, so "아늑했음" and, in a sentence, "아늑한" and "아늑함" give
  "아늑" (typed alone, "아늑한" is read as the adjective "아늑하다": the search terms add the
  root, ``pinlog_platform.contract.search.terms``);
- adverbs (``MAG``) except function adverbs (안, 못, 너무, 진짜 ...); an adverb ending in 히
  also gives its root ("조용히" -> "조용히", "조용");
- foreign words (``SL``) lower-cased: "WiFi" -> "wifi".

Endings, particles, suffixes, auxiliaries, copulas, dependent nouns, numbers and symbols are
never lemmas. ``negated`` marks a lemma inside a negation's scope: the word after 안/못 ("별로
안 아늑함"), the word before -지 않다/-지 못하다 ("조용하지 않음"), the words before 없다/
아니다/불가/금지 ("콘센트 없음", "해장으로는 아닌 듯", "애견 동반 불가"; over up to two
words without content: "콘센트가 하나도 없어서"), a noun after the
prefix 노 ("노키즈존"), and the word before a closing 별로 ("커피는 별로").
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kiwipiepy import Kiwi

NOUN_TAGS = frozenset({"NNG", "NNP"})
PREDICATE_TAGS = frozenset({"VV", "VA"})
# Adverbs that carry no content of their own (degree, truth, negation, frequency); 같이/함께
# too: companions are named by nouns (친구, 엄마), not by the adverb.
_FUNCTION_ADVERBS = (
    "안 못 너무 진짜 정말 좀 아주 매우 또 다 잘 더 꼭 그냥 별로 전혀 완전 엄청 되게 제일 가장"
    " 많이 조금 약간 바로 이미 아직 다시 그래서 근데 그런데 그리고 하지만 그래도 오늘 이제"
    " 계속 항상 자주 가끔 또한 역시 특히 같이 함께"
)
FUNCTION_ADVERBS = frozenset(_FUNCTION_ADVERBS.split())
PRE_NEGATORS = frozenset({"안", "못"})
# Predicates and nouns that deny the word before them.
POST_NEGATORS = frozenset({("없", "VA"), ("아니", "VCN"), ("불가", "NNG"), ("금지", "NNG")})
LONG_NEGATORS = frozenset({"않", "못하"})  # -지 않다, -지 못하다 (tag VX)


@dataclass(frozen=True, slots=True)
class Lemma:
    """One content lemma: ``form`` (shapes in the module docstring), Kiwi's POS ``tag`` without
    its irregular-conjugation suffix ("VA", not "VA-I"), ``negated`` (inside a negation's
    scope) and ``start`` (character offset of the morpheme in the analysed text)."""

    form: str
    tag: str
    negated: bool
    start: int


class KoreanLemmatizer:
    """Kiwi (package ``kiwipiepy``, model ``kiwipiepy-model``) behind a lock, loaded once.

    The multi-word proper-noun dictionary is not loaded (``load_multi_dict=False``): it doubles
    the memory and load time and names places and brands, not the words notes are judged by.
    """

    def __init__(self) -> None:
        self._kiwi: Kiwi | None = None
        self._lock = threading.Lock()
        self.load_seconds: float | None = None

    def load(self) -> None:
        """Load the model now (seconds; idempotent). ``RuntimeError`` from Kiwi propagates."""
        with self._lock:
            self._load_locked()

    def _load_locked(self) -> Kiwi:
        if self._kiwi is None:
            from kiwipiepy import Kiwi

            started = time.perf_counter()
            self._kiwi = Kiwi(load_multi_dict=False)
            self.load_seconds = time.perf_counter() - started
        return self._kiwi

    def analyse(self, text: str) -> list[Lemma]:
        """Content lemmas of ``text`` in text order, each with its negation mark."""
        if not text.strip():
            return []
        with self._lock:
            tokens = [
                (t.form, t.tag.split("-")[0], t.start, t.len)
                for t in self._load_locked().tokenize(text)
            ]
        return _lemmas(text, tokens)

    def lemmas(self, text: str) -> list[str]:
        """Lemma forms of ``text`` in text order, negated or not (for matching and search)."""
        return [lemma.form for lemma in self.analyse(text)]


def _word_index(text: str) -> list[int]:
    """For each character of ``text``, the index of the whitespace-separated word it is in."""
    index, word, in_space = [], -1, True
    for char in text:
        if char.isspace():
            in_space = True
        elif in_space:
            word, in_space = word + 1, False
        index.append(max(word, 0))
    return index


def _lemmas(text: str, tokens: list[tuple[str, str, int, int]]) -> list[Lemma]:
    word_of = _word_index(text)
    word = [word_of[min(start, len(text) - 1)] for _, _, start, _ in tokens]
    # word index -> whether every morpheme in it is a noun (a bare noun phrase "애견 동반")
    bare_noun = {}
    content_words = set()  # words holding a content lemma ("하나도", "전혀" hold none)
    for (form, tag, _, _), w in zip(tokens, word, strict=True):
        bare_noun[w] = bare_noun.get(w, True) and tag in NOUN_TAGS
        if _forms(form, tag):
            content_words.add(w)
    negated_words: set[int] = set()
    negated_tokens: set[int] = set()
    for i, (form, tag, start, length) in enumerate(tokens):
        w = word[i]
        if tag == "MAG" and form in PRE_NEGATORS:
            negated_words.add(w + 1)
        elif tag == "VX" and form in LONG_NEGATORS:
            # the word holding the -지 before it (same word "조용하진않" or the one before)
            ji = next(
                (j for j in range(i - 1, max(i - 4, -1), -1) if tokens[j][:2] == ("지", "EC")),
                None,
            )
            negated_words.add(word[ji] if ji is not None else w - 1)
        elif (form, tag) in POST_NEGATORS:
            before = [j for j in range(i) if word[j] == w]
            if any(tokens[j][1] in NOUN_TAGS for j in before):
                negated_tokens.update(before)
            else:
                # over at most two words without content: "콘센트가 하나도 없어서"
                target = w - 1
                while target > w - 3 and target > 0 and target not in content_words:
                    target -= 1
                negated_words.add(target)
                if bare_noun.get(target) and bare_noun.get(target - 1):
                    negated_words.add(target - 1)
        elif tag == "NNG" and form == "노" and i + 1 < len(tokens):
            following = tokens[i + 1]
            if following[1] in NOUN_TAGS and following[2] == start + length:
                negated_tokens.add(i + 1)
        elif tag == "MAG" and form == "별로":
            later = [t for j, t in enumerate(tokens) if j > i and word[j] == w + 1]
            if later and later[0][1] in PREDICATE_TAGS | {"XR"}:
                negated_words.add(w + 1)
            elif not later or later[0][1] in {"SF", "SP", "SS"}:
                negated_words.add(w - 1)
    out = []
    for i, (form, tag, start, _) in enumerate(tokens):
        negated = i in negated_tokens or word[i] in negated_words
        for lemma in _forms(form, tag):
            out.append(Lemma(lemma, tag, negated, start))
    return out


def _forms(form: str, tag: str) -> tuple[str, ...]:
    if tag in NOUN_TAGS:
        return () if form == "노" else (form,)
    if tag in PREDICATE_TAGS:
        return () if form == "없" else (form + "다",)
    if tag == "XR":
        return (form,)
    if tag == "SL":
        return (form.lower(),)
    if tag == "MAG" and form not in FUNCTION_ADVERBS:
        if form.endswith("히") and len(form) > 2:
            return (form, form[:-1])
        return (form,)
    return ()


_shared: KoreanLemmatizer | None = None
_shared_lock = threading.Lock()


def shared_analyser() -> KoreanLemmatizer:
    """The process's analyser (not loaded until :meth:`KoreanLemmatizer.load` or first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = KoreanLemmatizer()
        return _shared
