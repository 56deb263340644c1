"""Exit codes of both CLIs for startup problems (README "Exit codes").

Leaf module: the CLI reads it before anything heavy is imported, so a configuration error is
reported fast.
"""

CONFIGURATION = 2  # invalid or missing settings, unreadable preset file
DATABASE_UNREACHABLE = 3  # no connection (refused, DNS, timeout) or the login refused
DATABASE_NOT_READY = 4  # connected, but schema, privileges, migrations or presets are missing
PROVIDER = 5  # the embedding provider refused or failed (presets load)
