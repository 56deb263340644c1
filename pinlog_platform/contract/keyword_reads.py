"""Which stored keyword rows of a context a read may show (§9 "Keyword reads" and its
Deviation in docs/contract.md).

§9 shows a context's keywords once its keyword stage is ``COMPLETED``. A preset
reclassification (``pinlog-core reprocess keywords``) sends completed keyword stages back to
``PENDING`` and marks the row with ``keyword_reprocess_version``
(``0051_keyword_reprocess_marker.sql``); the keyword rows stored until then are the context's
previous judgment, and reads keep showing them while the stage is ``PENDING`` or
``PROCESSING``, and after it ended ``FAILED``. The worker's keyword save replaces the rows and
marks the stage ``COMPLETED`` in one statement, so a reader sees the previous set or the new
one, never an empty one in between. A ``CANCELLED`` stage never shows anything. The preset
rules of §9 (active, visibility) apply on top, in the statements.
"""

from __future__ import annotations

_SHOWN = (
    "({s}.keyword_status = 'COMPLETED' OR ({s}.keyword_reprocess_version IS NOT NULL "
    "AND {s}.keyword_status IN ('PENDING', 'PROCESSING', 'FAILED')))"
)


def keywords_shown(state_alias: str) -> str:
    """The SQL condition on the ``ai.context_ai_state`` row aliased ``state_alias`` under
    which its context's keyword rows may be shown (module docstring). Called at import with
    an alias written in the calling module; ``ValueError`` for anything but an identifier."""
    if not state_alias.isidentifier():
        raise ValueError(f"not an SQL alias: {state_alias!r}")
    return _SHOWN.format(s=state_alias)
