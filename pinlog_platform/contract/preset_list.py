"""The preset list a worker of one embedding profile judges with, and its version (§4, §5).

One definition for both services (docs/contract.md §1 and §4, Deviations):

- A preset is **usable under profile P** when it is active, not ``BLOCKED``, and has a vector
  of P embedded from its current revision: ``ai.keyword_preset_embedding.preset_version =
  ai.keyword_preset.version`` (``0050_keyword_preset_embedding.sql``). A vector of an earlier
  revision is stale: the list changed after P was last loaded, and nobody uses it.
- The **list version of P** is the highest ``keyword_preset.version`` among the presets usable
  under P; 0 when there are none. Every ``pinlog-ai presets load`` that changes the list writes
  the new version on every row of the file, so all usable presets share it.

The worker's cache loads the usable presets with ``USABLE_PRESETS`` and reports the highest
version among the rows it loaded as ``presetVersion`` in ``/readyz``, and stamps it on each
judgment (``preset_version``). ``pinlog-core reprocess keywords`` reads ``LIST_VERSION`` and
waits until every worker reports it. Both read the same rows by the same clause, so "the
version a worker loaded" and "the current version" can only differ by time.
"""

from __future__ import annotations

from sqlalchemy import text

# The presets usable under the profile :profile, aliased p (the preset) and e (its vector):
# a FROM and WHERE clause that statements select from.
USABLE_PRESETS = """
    FROM ai.keyword_preset AS p
    JOIN ai.keyword_preset_embedding AS e
      ON e.preset_id = p.id AND e.embedding_profile = :profile AND e.preset_version = p.version
    WHERE p.is_active AND p.visibility <> 'BLOCKED'
"""

# The list version of :profile (module docstring); 0 when no preset is usable under it.
LIST_VERSION = text("SELECT coalesce(max(p.version), 0) AS list_version" + USABLE_PRESETS)
