"""Cuts applied to a personal search's ranked hits (§7 and its recorded deviation): one rule
for the worker's internal search (off by default: §7's exact result set), the core's client
search (on by default) and ``bench/search_quality.py``, which chose the offline defaults.

- An absolute floor: a hit below ``floor`` (cosine) is not shown.
- A lower floor, ``floor_word``, for a short one-word query (at most ``WORD_MAX_CHARACTERS``
  characters, none of them white space by ``str.isspace``): such a query carries little text,
  and its similarity to a matching note is lower than a sentence's.
- A relative cut: a hit below ``top_ratio`` times the best hit's similarity is not shown.

A value of 0 turns its cut off. Hits are any objects with a ``similarity``, best first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

WORD_MAX_CHARACTERS = 5


class Ranked(Protocol):
    @property
    def similarity(self) -> float: ...


H = TypeVar("H", bound=Ranked)


def is_short_word(query: str) -> bool:
    """A query of at most five characters with no white space (after normalisation)."""
    return 0 < len(query) <= WORD_MAX_CHARACTERS and not any(c.isspace() for c in query)


@dataclass(frozen=True, slots=True)
class SearchCuts:
    """Cosine floors and the ratio to the best hit; 0 = that cut off."""

    floor: float = 0.0
    floor_word: float = 0.0
    top_ratio: float = 0.0

    @property
    def active(self) -> bool:
        return bool(self.floor or self.floor_word or self.top_ratio)

    def floor_for(self, query: str) -> float:
        """The absolute floor that applies to ``query`` (0: none)."""
        return self.floor_word if is_short_word(query) else self.floor

    def apply(self, query: str, hits: Sequence[H]) -> list[H]:
        """The hits, best first, that survive the cuts for ``query``."""
        floor = self.floor_for(query)
        kept = [hit for hit in hits if not floor or hit.similarity >= floor]
        if self.top_ratio and kept and kept[0].similarity > 0:
            bar = self.top_ratio * kept[0].similarity
            kept = [hit for hit in kept if hit.similarity >= bar]
        return kept


# The core's defaults (docs/contract.md §7, Deviation): production values, as a comparable
# production worker uses them; per embedding profile where measured (bench/search_quality.py).
PRODUCTION_CUTS = SearchCuts(floor=0.30, floor_word=0.24, top_ratio=0.60)
# The offline profile's: chosen for the fused search with its list weights and keyword match,
# where the cuts drop only semantic-only results (bench/member_search_quality.py,
# docs/search.md; before fusion 0.36 / 0.24 / 0.50, chosen by bench/search_quality.py for the
# semantic list alone). The one-word floor is the higher: a one-word query's own word is found
# by the lexical list, and the encoder's nearest notes to a word it sees alone are the least
# reliable.
MEASURED_CUTS = {
    "local-use-multilingual-v3-512-cosine-v1": SearchCuts(
        floor=0.22, floor_word=0.44, top_ratio=0.50
    ),
}


def default_cuts(profile: str) -> SearchCuts:
    """The core's cuts for an embedding profile when none is configured."""
    return MEASURED_CUTS.get(profile, PRODUCTION_CUTS)


def clamp_similarity(value: float) -> float:
    """A cosine within [-1, 1] (float noise can step just outside)."""
    return max(-1.0, min(1.0, value))
