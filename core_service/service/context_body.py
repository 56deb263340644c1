"""The one normalisation of a note body (§9 "normalise the same way bodies are normalised").

``normalize_body`` is used on save, on modify (to compare with the stored body) and mirrored by
the ``context_body_normalised`` CHECK of ``core.context``, so the API, the domain and the
database agree on what a body is:

- Unicode NFC (decomposed Hangul from iOS/macOS equals its composed form);
- ``TRIMMED_CHARACTERS`` removed from both ends: Python's white space plus invisible format
  characters and Hangul fillers, which render as nothing at the edge of a note;
- at least 1 and at most ``MAX_BODY_CHARACTERS`` code points afterwards, at least one of them
  visible (not white space, a format or control character, a lone mark or a blank glyph).

The database CHECK enforces the trimming and the length, which mean the same in every Unicode
version; NFC and visibility depend on the Unicode tables, which PostgreSQL and Python may have
in different versions, so they are this function's alone.

Interior characters are kept as written.
"""

from __future__ import annotations

import re
import unicodedata

from core_service.errors import InvalidBodyError

MAX_BODY_CHARACTERS = 500

# Listed in the same order in the CHECK of 0005_core_tables.sql; a test compares them.
TRIMMED_CHARACTERS = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
    "\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e"
    "\u115f\u1160\u3164\uffa0"
)

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

# Letters and symbols that render as blank space: Hangul fillers, the braille blank.
_BLANK_GLYPHS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def normalize_body(raw: str, *, field: str = "body") -> str:
    """The body as stored: NFC, edges trimmed, 1..500 characters, something visible.

    Raises ``InvalidBodyError`` (HTTP 422) with a message that names ``field`` and the rule,
    never the text: NUL or lone surrogates (PostgreSQL cannot store them), blank (nothing but
    white space, format characters, lone marks or blank symbols), too long. Search queries go
    through the same rules (``field="query"``).
    """
    return normalize_text(raw, field=field, max_characters=MAX_BODY_CHARACTERS)


def normalize_text(raw: str, *, field: str, max_characters: int) -> str:
    """``normalize_body``'s rules with another limit, for every free text a member sends
    (place ids and names too, so NFC and NFD spellings of one place are one place)."""
    if _UNSTORABLE.search(raw):
        raise InvalidBodyError(
            f"{field} contains characters that cannot be stored (NUL or a lone surrogate)",
            loc=("body", field),
        )
    normalised = unicodedata.normalize("NFC", raw).strip(TRIMMED_CHARACTERS)
    if not any(_visible(char) for char in normalised):
        raise InvalidBodyError(f"{field} is blank", loc=("body", field))
    if len(normalised) > max_characters:
        raise InvalidBodyError(
            f"{field} has {len(normalised)} characters after normalisation; "
            f"at most {max_characters} are allowed",
            loc=("body", field),
        )
    return normalised


def _visible(char: str) -> bool:
    # Separators (Z*), controls and format characters (C*) and marks without a base (M*)
    # render as nothing; so do a few letters and symbols used as blanks.
    return unicodedata.category(char)[0] not in "ZCM" and char not in _BLANK_GLYPHS


# C0 and C1 controls (ESC, BEL, CR, LF, DEL included) and the bidirectional formatting
# characters: marks, embeddings, overrides and isolates.
_CONTROL_OR_BIDI = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def refuse_control_characters(value: str, *, field: str) -> str:
    """``value`` unless it holds a control or bidirectional formatting character, which could
    reorder or hide what a name shows: ``InvalidBodyError`` (HTTP 422) naming
    ``field``. For names and external ids only; note bodies keep their line breaks."""
    if _CONTROL_OR_BIDI.search(value):
        raise InvalidBodyError(
            f"{field} contains control or bidirectional formatting characters", loc=("body", field)
        )
    return value
