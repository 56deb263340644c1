"""Which presets a query's meaning matches (docs/contract.md §7, ``matchedKeywordIds``): one
rule for the worker's ``SEARCH_SIMILAR`` (its ``matched`` fragment) and for
``bench/member_search_quality.py``, which chose its settings on the development queries.

A preset matches when its vector's cosine to the query's is above the threshold
(``PINLOG_SEARCH_KEYWORD_MATCH_THRESHOLD``) and, when ``top`` is set
(``PINLOG_SEARCH_KEYWORD_MATCH_TOP``), it is among the ``top`` presets closest to the query
(ties by the lower id). A record carrying a matched preset (§9: its owner sees the keyword) is
``keywordMatched`` and in the keyword list.
"""

from __future__ import annotations

from collections.abc import Mapping


def matched_presets(cosines: Mapping[int, float], *, threshold: float, top: int) -> set[int]:
    """Ids of ``cosines`` (preset id -> cosine to the query) that match; ``top`` 0: every
    preset above ``threshold``."""
    above = sorted(
        (preset_id for preset_id, cosine in cosines.items() if cosine > threshold),
        key=lambda preset_id: (-cosines[preset_id], preset_id),
    )
    return set(above[:top] if top else above)
