"""The autoscaler's query: how much work waits for the workers of one embedding profile
(KEDA's PostgreSQL trigger, ``deploy/kubernetes/``; docs/scaling.md "Autoscaling on the
backlog").

A profile's work is

- the live stages, while the profile is the one in use (``core.embedding_switch``, else the
  core's configured profile ``default_profile``): every state row whose next stage (embedding,
  then keyword) is ``PENDING`` or ``PROCESSING``. That is ``pinlog-core status``'s backlog
  (``PENDING``, or ``PROCESSING`` past the expiry), the stages a worker holds (``PROCESSING``
  within the expiry) and the keyword stages a reprocess sent back, in one predicate, the one
  of the partial index ``context_ai_state_unbatched_work_idx`` (0121): not the keyword stages
  a ``reprocess keywords --via batch`` marked (``keyword_via_batch``: the provider judges
  them, not a worker);
- the open backfill rows of that profile (``PENDING`` or ``PROCESSING``) that no provider
  batch holds (a batch id set, ``reembed start --via batch``: the provider works on those, not
  a worker), through ``context_embedding_backfill_unheld_idx`` (0117).

Both are read from their indexes alone (index-only scans: no note, no owner, no vector), and
the count stops at ``WORK_CAP`` rows (a count over a ``LIMIT`` subquery), so one poll costs at
most that many index entries however long the backlog. The cap is far above what changes the
replica count (``maxReplicaCount`` × the target value per replica, checked by
``tests/ops/test_kubernetes_manifests.py``). Deleted contexts need no join with ``core.*``: a
deletion sets their stages ``CANCELLED`` in its own transaction (§9).

KEDA sends the query as text without parameters, so the manifests carry it rendered for their
profile (``render``); ``SCALER_WORK`` is the same statement with bound parameters, the one the
plan test and the bench run. The role ``SCALER_ROLE`` (0106, 0118, 0122) may read exactly
the columns it reads.
"""

from __future__ import annotations

import re

from sqlalchemy import text

SCALER_ROLE = "pinlog_scaler"
# The LIMIT written three times in _WORK_SQL (a test holds them equal).
WORK_CAP = 2000

# Profile names are ``<model>-<dimension>-<distance>-v<n>`` (app/settings/profiles.py); only
# these characters may be put into the rendered query, which KEDA cannot bind.
_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,99}")

_WORK_SQL = """
SELECT count(*) AS work FROM (
    (SELECT 1 FROM ai.context_ai_state
     WHERE (embedding_status IN ('PENDING', 'PROCESSING')
            OR (embedding_status = 'COMPLETED' AND keyword_status IN ('PENDING', 'PROCESSING')
                AND NOT keyword_via_batch))
       AND (SELECT coalesce(max(profile_in_use), :default_profile)
            FROM core.embedding_switch) = :profile
     LIMIT 2000)
    UNION ALL
    (SELECT 1 FROM ai.context_embedding_backfill
     WHERE embedding_profile = :profile AND status IN ('PENDING', 'PROCESSING')
       AND batch_id IS NULL
     LIMIT 2000)
    LIMIT 2000
) AS waiting
"""
# The work of :profile (module docstring); one row, ``work``, between 0 and WORK_CAP.
SCALER_WORK = text(_WORK_SQL)


def render(profile: str, *, default_profile: str) -> str:
    """``SCALER_WORK`` with its parameters written in as literals, for a KEDA trigger's
    ``query``; one line, single spaces. Raises ``ValueError`` for a name that is not a profile
    name (nothing but ``[A-Za-z0-9._:-]``, at most 100 characters)."""
    for name in (profile, default_profile):
        if not _PROFILE_NAME.fullmatch(name):
            raise ValueError(f"not a profile name: {name!r}")
    literals = {":default_profile": f"'{default_profile}'", ":profile": f"'{profile}'"}
    query = re.sub(r":default_profile|:profile", lambda m: literals[m.group(0)], _WORK_SQL)
    return normalise(query)


def normalise(query: str) -> str:
    """``query`` on one line with single spaces and no space inside parentheses, to compare
    the manifests' text with ``render``."""
    flat = " ".join(query.split())
    return flat.replace("( ", "(").replace(" )", ")")
