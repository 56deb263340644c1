"""The lexical index's terms (docs/search.md "Choosing the analyser"): a one-word query and a
note meet on a root whichever way Kiwi reads the word."""

from __future__ import annotations

import pytest

from pinlog_platform.contract.search import terms


@pytest.mark.parametrize(
    ("query", "note"),
    [
        ("아늑한", "진짜 아늑했음. 또 갈 듯"),
        ("조용한", "평일 오후라 조용했음"),
        ("피곤한", "야근하고 피곤한 날 들름"),
    ],
)
def test_a_one_word_adjective_query_shares_a_term_with_the_note(query, note):
    assert set(terms.query_terms(query)) & set(terms.analyse(note).terms)


def test_a_one_syllable_root_is_not_added_and_the_revision_names_the_rule():
    # 편하다 -> 편 would match 편의점, 남편 ... by a syllable that means nothing alone.
    assert "편" not in terms.query_terms("편한")
    assert terms.ANALYSER_VERSION.endswith("/t2")
