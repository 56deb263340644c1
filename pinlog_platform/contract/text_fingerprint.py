"""The digest of a context's text both services compute the same way (§3, scenario 5).

The core writes it on the ``PENDING`` state row when it creates a context; the worker computes
it from every process request and refuses a request whose text does not match it. One function
here, so the two sides can never disagree on what "the same text" means.
"""

from __future__ import annotations

import hashlib
import unicodedata

# octet_length(ai.context_ai_state.text_sha256) (0009_state_row_fingerprint.sql).
DIGEST_BYTES = 32


def fingerprint(text: str) -> bytes:
    """SHA-256 (32 bytes) of the NFC text's UTF-8, so NFC and NFD forms of one note agree.

    Lone surrogates (which the worker refuses later anyway) are encoded with
    ``surrogatepass`` rather than raising, so any JSON string has a digest.
    """
    nfc = unicodedata.normalize("NFC", text)
    return hashlib.sha256(nfc.encode("utf-8", "surrogatepass")).digest()
