"""BM25 as the lexical list scores it (docs/search.md "Lexical"): one formula for the core's
query (``core_service.repository.context_search.LEXICAL_MATCHES``) and for
``bench/search_quality.py``, which chose the floor on the development queries.

For a member's live notes: ``N`` notes, mean length ``L`` (content terms), a term in ``df`` of
them; a note of length ``l`` with a term ``tf`` times scores, summed over the query's distinct
terms, ``ln(1 + (N - df + 0.5) / (df + 0.5)) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * l / L))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

BM25_K1 = 1.2
BM25_B = 0.75


def bm25_scores(query_terms: Sequence[str], documents: Sequence[Mapping[str, int]]) -> list[float]:
    """The score of each document (term -> count) for the query's distinct terms."""
    n = len(documents)
    if not n:
        return []
    lengths = [sum(doc.values()) for doc in documents]
    mean_length = max(sum(lengths) / n, 1.0)
    terms = set(query_terms)
    df = {term: sum(1 for doc in documents if term in doc) for term in terms}
    scores = []
    for doc, length in zip(documents, lengths, strict=True):
        score = 0.0
        for term in terms:
            tf = doc.get(term, 0)
            if tf:
                idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                norm = tf + BM25_K1 * (1 - BM25_B + BM25_B * length / mean_length)
                score += idf * tf * (BM25_K1 + 1) / norm
        scores.append(score)
    return scores
