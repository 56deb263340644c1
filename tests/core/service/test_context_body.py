"""The one body normalisation (§9) and the ``core.context`` CHECK agree character by character
on trimming and length; NFC and visibility are the domain's alone (their Unicode tables can be
of another version in PostgreSQL)."""

from __future__ import annotations

import unicodedata

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from core_service.errors import InvalidBodyError
from core_service.service.context_body import (
    MAX_BODY_CHARACTERS,
    TRIMMED_CHARACTERS,
    normalize_body,
)
from tests.core.harness import make_member

INSERT_BODY = text(
    "INSERT INTO core.context (record_id, member_id, body) VALUES (:record_id, 1, :body)"
)


def test_nfd_and_nfc_hangul_normalise_to_the_same_stored_body():
    nfc = "비 오는 날 창가 자리"
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfd != nfc
    assert normalize_body(nfd) == normalize_body(nfc) == nfc


def test_every_trimmed_character_is_removed_from_both_ends_and_kept_inside():
    for char in TRIMMED_CHARACTERS:
        assert normalize_body(f"{char}{char}조용함{char}") == "조용함"
        inside = f"조{char}용"
        assert normalize_body(inside) == unicodedata.normalize("NFC", inside)


@pytest.mark.parametrize(
    "body", ["", "   \n\t", "\u3000\u3000", "\u200b\u200b", "\ufeff\u200b \u00a0", "\u3164"]
)
def test_blank_and_invisible_bodies_are_refused_as_blank(body):
    with pytest.raises(InvalidBodyError, match="body is blank"):
        normalize_body(body)


def test_length_is_counted_after_normalisation():
    assert len(normalize_body("  " + "가" * MAX_BODY_CHARACTERS + "\n")) == MAX_BODY_CHARACTERS
    with pytest.raises(InvalidBodyError, match="501 characters after normalisation"):
        normalize_body("가" * (MAX_BODY_CHARACTERS + 1))


@pytest.mark.parametrize("body", ["a\x00b", "a\ud800b"])
def test_unstorable_characters_are_refused_without_echoing_the_text(body):
    with pytest.raises(InvalidBodyError, match="cannot be stored") as caught:
        normalize_body(body)
    assert body not in str(caught.value)


def test_whitespace_only_difference_is_the_same_body():
    """A no-op edit compares the normalised request with the stored body in SQL."""
    stored = normalize_body("콘센트 많음")
    assert normalize_body("  콘센트 많음\n") == stored
    assert normalize_body(unicodedata.normalize("NFD", "콘센트 많음")) == stored
    assert normalize_body("콘센트 많음!") != stored


async def _record(engine) -> int:
    await make_member(engine, 1)
    async with engine.begin() as conn:
        place_id = (
            await conn.execute(
                text(
                    "INSERT INTO core.place (external_place_id, name) "
                    "VALUES ('p', 'n') RETURNING id"
                )
            )
        ).scalar_one()
        return (
            await conn.execute(
                text("INSERT INTO core.record (member_id, place_id) VALUES (1, :p) RETURNING id"),
                {"p": place_id},
            )
        ).scalar_one()


def _candidate_characters() -> list[str]:
    # Every trimmed character, and every other BMP character that is white space, a format or
    # a control character: the ones a database trim list and a Python one could disagree on.
    others = [
        chr(code)
        for code in range(1, 0x10000)
        if unicodedata.category(chr(code)) in {"Zs", "Zl", "Zp", "Cf", "Cc"}
        and chr(code) not in TRIMMED_CHARACTERS
    ]
    return list(TRIMMED_CHARACTERS) + others


async def test_database_check_accepts_exactly_what_the_domain_function_stores(engine):
    record_id = await _record(engine)
    disagreements = []
    async with engine.connect() as conn:
        for char in _candidate_characters():
            body = f"x{char}"
            domain_accepts_as_is = normalize_body(body) == body
            transaction = await conn.begin()
            try:
                await conn.execute(INSERT_BODY, {"record_id": record_id, "body": body})
                database_accepts = True
            except IntegrityError:
                database_accepts = False
            await transaction.rollback()
            if domain_accepts_as_is != database_accepts:
                disagreements.append(f"U+{ord(char):04X}")
    assert disagreements == []


@pytest.mark.parametrize(
    "body",
    ["", "가" * (MAX_BODY_CHARACTERS + 1), " 앞 공백", "뒤 공백\u200b"],
)
async def test_database_check_refuses_bodies_the_domain_would_never_store(engine, body):
    record_id = await _record(engine)
    async with engine.connect() as conn:
        with pytest.raises(IntegrityError, match="context_body_normalised"):
            await conn.execute(INSERT_BODY, {"record_id": record_id, "body": body})


@pytest.mark.parametrize(
    "body",
    [
        "\u200e",  # left-to-right mark
        "\u202e\u202c",  # bidi override and pop
        "\u2066\u2069",  # bidi isolate
        "\u2800",  # braille blank
        "\ufe0f",  # a variation selector alone
        "\u034f",  # combining grapheme joiner
        "\U000e0020",  # tag space
        "\u2062",  # invisible times
        "\u180b",  # Mongolian free variation selector
        "\u17b4",  # Khmer inherent vowel
        " \u0301 ",  # a combining mark without a base
    ],
)
def test_bodies_with_nothing_visible_are_blank(body):
    with pytest.raises(InvalidBodyError, match="body is blank"):
        normalize_body(body)


def test_an_emoji_keeps_its_variation_selector_at_the_end():
    assert normalize_body("좋아요 \u2764\ufe0f\n") == "좋아요 \u2764\ufe0f"


async def test_a_check_violation_is_a_422_that_never_quotes_the_row(engine):
    """The driver's message quotes the failing row (a note); ours names the rule only."""
    from core_service.repository.db import transaction

    record_id = await _record(engine)
    secret = " 비밀 메모가 들어간 행"
    with pytest.raises(InvalidBodyError) as caught:
        async with transaction(engine) as conn:
            await conn.execute(INSERT_BODY, {"record_id": record_id, "body": secret})
    assert str(caught.value) == "body cannot be stored"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
