"""Normalisation of a context's text before it is embedded or judged (§3, §6, FC-09, FC-10)."""

from __future__ import annotations

import unicodedata

import pytest

from app.errors import InvalidInputError
from app.service.context_text import fingerprint, has_content, normalize, prepare_for_embedding

NOTE = "성수동 조용한 카페"


def test_normalize_composes_decomposed_hangul_to_nfc():
    decomposed = unicodedata.normalize("NFD", NOTE)
    assert decomposed != NOTE

    assert normalize(decomposed) == NOTE


def test_normalize_leaves_nfc_hangul_latin_and_emoji_unchanged():
    text = "카페 Café ☕️ 👍🏽"

    assert normalize(text) == text


def test_normalize_keeps_zero_width_joiner_emoji_sequences():
    family = "👨\u200d👩\u200d👧"
    technologist = "👩\u200d💻"

    assert normalize(f"{family} {technologist}") == f"{family} {technologist}"


@pytest.mark.parametrize(
    "invisible",
    ["\u200b", "\u2060", "\ufeff", "\u00ad", "\u180e", "\u115f", "\u1160", "\u3164", "\uffa0"],
)
def test_normalize_removes_invisible_characters(invisible):
    assert normalize(f"메{invisible}모") == "메모"


def test_normalize_trims_surrounding_white_space():
    assert normalize(" \u3000\n메모\t ") == "메모"


@pytest.mark.parametrize("text", ["메모\x00", "메모\ud800", "\udfff"])
def test_normalize_rejects_text_that_cannot_be_encoded(text):
    with pytest.raises(InvalidInputError, match="not encodable"):
        normalize(text)


@pytest.mark.parametrize("text", ["", " ", "\u3000", "\u00a0", "\u2028", "\u200e\u200f"])
def test_has_content_is_false_for_white_space_and_format_characters_only(text):
    assert not has_content(text)


@pytest.mark.parametrize("text", ["메모", "a", "1", "☕", ".", "\u00a0x"])
def test_has_content_is_true_when_a_visible_character_remains(text):
    assert has_content(text)


@pytest.mark.parametrize(
    "text", ["", "   \n\t", "\u3000\u3000", "\u200b\u200b", "\ufeff\u200b \u00a0", "\u3164"]
)
def test_prepare_for_embedding_rejects_fc09_blank_texts(text):
    with pytest.raises(InvalidInputError, match="blank"):
        prepare_for_embedding(text, max_chars=100)


def test_prepare_for_embedding_accepts_text_after_a_hangul_filler():
    assert prepare_for_embedding("\u3164메모", max_chars=100) == "메모"


def test_prepare_for_embedding_rejects_text_longer_than_the_limit():
    with pytest.raises(InvalidInputError, match="longer"):
        prepare_for_embedding("가" * 11, max_chars=10)


def test_prepare_for_embedding_counts_the_limit_after_normalisation():
    decomposed = unicodedata.normalize("NFD", "가" * 10)  # 20 code points before NFC
    padded = "  \u200b" + decomposed + "\u200b  "

    assert prepare_for_embedding(padded, max_chars=10) == "가" * 10


def test_prepare_for_embedding_rejects_unencodable_text():
    with pytest.raises(InvalidInputError, match="not encodable"):
        prepare_for_embedding("메모\x00", max_chars=100)


def test_fingerprint_is_equal_for_nfd_and_nfc_forms():
    assert fingerprint(unicodedata.normalize("NFD", NOTE)) == fingerprint(NOTE)


def test_fingerprint_differs_for_different_texts_and_is_32_bytes():
    first, second = fingerprint(NOTE), fingerprint(NOTE + "!")

    assert first != second
    assert len(first) == len(second) == 32


def test_fingerprint_accepts_a_lone_surrogate():
    assert len(fingerprint("\ud800")) == 32
