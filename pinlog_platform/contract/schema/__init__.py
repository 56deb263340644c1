"""The one schema of both services: ordered SQL files and the runner that applies them (§1).

Shared by the core service (``pinlog-core db upgrade``: every file) and the AI worker
(``pinlog-ai db upgrade``: the ``ai`` files only), so there is one ledger and one lock.
"""

from pinlog_platform.contract.schema.runner import (
    MigrationError,
    MigrationFile,
    MigrationPrivilegeError,
    Scope,
    discover,
    upgrade,
)

__all__ = [
    "MigrationError",
    "MigrationFile",
    "MigrationPrivilegeError",
    "Scope",
    "discover",
    "upgrade",
]
