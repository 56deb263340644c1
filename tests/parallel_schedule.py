"""How ``pytest -n N`` hands tests to its workers: one test at a time, except that an e2e
module goes whole to one worker, and the tests that start processes go first.

An e2e module starts a worker and a core process once for all its tests (the module-scoped
``services`` fixture); split over workers it would start them once per worker. Handing out the
long tests first, and the short ones one by one after, keeps every worker busy until the end
instead of leaving one to finish a long e2e test alone.
"""

from __future__ import annotations

import pytest

# Test modules (paths relative to the repository) under this folder go whole to one worker.
WHOLE_MODULE_FOLDER = "tests/e2e/"


def runs_whole(nodeid: str) -> bool:
    return nodeid.startswith(WHOLE_MODULE_FOLDER)


def processes_first(items: list[pytest.Item]) -> None:
    """Put the ``processes`` tests first, in place, keeping the order within each part. Every
    worker collects the same order (xdist requires it); tests never depend on their order."""
    items.sort(key=lambda item: item.get_closest_marker("processes") is None)


def make_scheduler(config: pytest.Config, log) -> object:
    """xdist's scope scheduler with a scope per test, or per module for ``runs_whole``.

    xdist queues the scopes with the most tests first, then the rest in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class WholeE2eModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid.split("::", 1)[0] if runs_whole(nodeid) else nodeid

    return WholeE2eModules(config, log)


# The serial pass (``pytest -n 2 --dist loadgroup -m serial``) runs two lanes side by side:
# the end-to-end tests that start both services one after the other in one, the tests that
# hold a single server to a time bound (deadlines, slow clients, rate budgets) in the other.
# Each lane still runs one test at a time; no two heavy tests ever share the machine.
SERIAL_E2E_LANE, SERIAL_TIMING_LANE = "serial-e2e", "serial-timing"


def serial_lane(module: str) -> str:
    """The serial pass's lane of a test of ``module`` (a path relative to the repository)."""
    return SERIAL_E2E_LANE if module.startswith("tests/e2e/") else SERIAL_TIMING_LANE
