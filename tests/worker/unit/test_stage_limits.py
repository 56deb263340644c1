"""The limits every stage runs under are one value: built once from the settings,
shared by the start and both stages, with the stage deadline derived from the expiry (§2)."""

from __future__ import annotations

import dataclasses

import pytest

from app import failure_policy
from app.service.stage_limits import StageLimits


def test_the_deadline_is_the_policy_share_of_the_expiry():
    limits = StageLimits(expiry_seconds=600, max_input_chars=6000)

    assert limits.deadline_seconds == failure_policy.stage_deadline_seconds(600) == 540


def test_the_limits_cannot_change_after_startup():
    limits = StageLimits(expiry_seconds=600, max_input_chars=6000)

    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.expiry_seconds = 1  # type: ignore[misc]
