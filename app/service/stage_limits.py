"""The limits every stage of a context runs under, one value built once from the settings."""

from __future__ import annotations

from dataclasses import dataclass, field

from app import failure_policy
from app.service.abandoned_claims import AbandonedClaims


@dataclass(frozen=True, slots=True)
class StageLimits:
    """The knobs the start and both stages share, given to each as one value.

    ``expiry_seconds``: a ``PROCESSING`` stage older than this may be reclaimed (§2);
    ``max_input_chars``: longer normalised text is invalid input (§6, FC-09);
    ``abandoned``: the attempts this process gave up, which its next request for the context
    takes over at once (``app.service.abandoned_claims``), shared by the start and both stages.
    """

    expiry_seconds: float
    max_input_chars: int
    abandoned: AbandonedClaims = field(default_factory=AbandonedClaims, compare=False)

    @property
    def deadline_seconds(self) -> float:
        """Seconds from a stage's claim to its save (``failure_policy.stage_deadline_seconds``)."""
        return failure_policy.stage_deadline_seconds(self.expiry_seconds)
