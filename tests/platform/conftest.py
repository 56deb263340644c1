"""Fixtures of the platform tests."""

from __future__ import annotations

import logging

import pytest


@pytest.fixture
def restore_root_logging():
    """The root logger's handlers and level as they were, after a test that configures logging."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
