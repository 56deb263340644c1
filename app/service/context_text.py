"""Normalisation and validation of a context's text before any use (§3, FC-09, FC-10).

Normalised text is Unicode NFC with invisible characters removed. Zero-width joiners and
variation selectors are kept: emoji sequences need them (FC-10).
"""

from __future__ import annotations

import re
import unicodedata

from app.errors import InvalidInputError
from pinlog_platform.contract.states.failure_reasons import FailureReason
from pinlog_platform.contract.text_fingerprint import fingerprint

__all__ = ["fingerprint", "has_content", "normalize", "prepare_for_embedding"]

# Characters that render as nothing and carry no meaning in a note.
_INVISIBLE = dict.fromkeys(
    map(
        ord,
        "\u200b"  # zero-width space
        "\u2060"  # word joiner
        "\ufeff"  # byte-order mark / zero-width no-break space
        "\u00ad"  # soft hyphen
        "\u180e"  # Mongolian vowel separator
        "\u115f\u1160\u3164\uffa0",  # Hangul fillers
    )
)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def normalize(text: str) -> str:
    """NFC, invisible characters removed, surrounding white space trimmed.

    Raises ``InvalidInputError`` for text that cannot be encoded (NUL, lone surrogates).
    """
    if "\x00" in text or _LONE_SURROGATE.search(text):
        raise InvalidInputError("text is not encodable")
    return unicodedata.normalize("NFC", text).translate(_INVISIBLE).strip()


def has_content(normalized: str) -> bool:
    """False when only white space and format characters (category Cf/Z*/Cc) remain."""
    return any(unicodedata.category(char)[0] not in "ZC" for char in normalized)


def prepare_for_embedding(text: str, *, max_chars: int) -> str:
    """The normalised text to embed and judge.

    Raises ``InvalidInputError``: not encodable, blank after normalisation, or longer than
    ``max_chars`` characters (the model's input limit). All are permanent (§6).
    """
    normalized = normalize(text)
    if len(normalized) > max_chars:  # first: it bounds the per-character scan below
        raise InvalidInputError(
            "text is longer than the model accepts", reason=FailureReason.INPUT_TOO_LONG
        )
    if not has_content(normalized):
        raise InvalidInputError(
            "text is blank after normalisation", reason=FailureReason.INPUT_BLANK
        )
    return normalized
