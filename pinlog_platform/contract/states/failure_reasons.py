"""Why a stage is ``FAILED``: the closed set of reason codes stored beside its status.

Each stage has a reason column (``embedding_failure``, ``keyword_failure``;
``0010_stage_failure_reasons.sql``), written in the same statement that writes ``FAILED``.
The values are an interface shared by both services and the client API's record read, and
equal the migration's CHECK list (``tests/platform/test_failure_reasons.py``). A code never
carries user text or a provider's message.

Leaf module: imports neither service.
"""

from __future__ import annotations

from enum import StrEnum

from pinlog_platform.contract.states import Stage


class FailureReason(StrEnum):
    """Reason code of a ``FAILED`` stage; the worker writes the first eight, the core the
    ``embedding_failed`` and ``retries_exhausted`` closures; ``unknown`` stands for a row failed
    before the column existed (or a cause with no code of its own)."""

    INPUT_TOO_LONG = "input_too_long"
    INPUT_BLANK = "input_blank"  # FC-09
    INPUT_REJECTED = "input_rejected"
    DIMENSION_MISMATCH = "dimension_mismatch"  # §5, FC-05 (a)
    JUDGE_OUTPUT_INVALID = "judge_output_invalid"
    JUDGE_REFUSED = "judge_refused"  # FC-08 (b)
    JUDGE_TRUNCATED = "judge_truncated"  # FC-08 (a), (c)
    PROFILE_MISMATCH = "profile_mismatch"  # §4, §5
    EMBEDDING_FAILED = "embedding_failed"  # a keyword stage that can never run (core)
    RETRIES_EXHAUSTED = "retries_exhausted"  # the core's finalizer (§9)
    UNKNOWN = "unknown"


# The column holding each stage's reason, by the stage's status column (``Stage`` value);
# declared with the stage (``Stage.failure_column``).
FAILURE_COLUMNS = {stage.status_column: stage.failure_column for stage in Stage}
