"""The one settings object (prefix ``PINLOG_``); the only package that reads the environment.

One module per concern: ``profiles`` (profile names, the offline presets), ``providers`` (who
embeds and judges, where), ``limits`` (durations, counts, sizes), and ``worker``, which
assembles ``Settings`` from them and holds the smaller classes of the commands.
"""

from app.settings.limits import (
    SEARCH_CONNECTIONS,
    STAGE_CONNECTIONS_CAP,
    SUPPORT_CONNECTIONS,
)
from app.settings.profiles import (
    LEARNED_JUDGE_REVISION,
    MODEL_PROFILE_MAX_LENGTH,
    OFFLINE_DEFAULTS,
    OFFLINE_EMBEDDING_MODEL,
    OFFLINE_PROFILE,
    PRODUCTION_PROFILE,
    USE_DIMENSION,
    USE_EMBEDDING_MODEL,
    USE_PROFILE,
)
from app.settings.worker import (
    ENV_PREFIX,
    INTERNAL_SECRET_MIN_LENGTH,
    DatabaseSettings,
    DoctorSettings,
    LoggingSettings,
    MigrationSettings,
    Settings,
    SmokeSettings,
    ToolSettings,
    TracingSettings,
)

__all__ = [
    "ENV_PREFIX",
    "INTERNAL_SECRET_MIN_LENGTH",
    "LEARNED_JUDGE_REVISION",
    "MODEL_PROFILE_MAX_LENGTH",
    "OFFLINE_DEFAULTS",
    "OFFLINE_EMBEDDING_MODEL",
    "OFFLINE_PROFILE",
    "PRODUCTION_PROFILE",
    "SEARCH_CONNECTIONS",
    "STAGE_CONNECTIONS_CAP",
    "SUPPORT_CONNECTIONS",
    "USE_DIMENSION",
    "USE_EMBEDDING_MODEL",
    "USE_PROFILE",
    "DatabaseSettings",
    "DoctorSettings",
    "LoggingSettings",
    "MigrationSettings",
    "Settings",
    "SmokeSettings",
    "ToolSettings",
    "TracingSettings",
]
