"""The contract between the two services, as code both read (§0, docs/architecture.md): the
state vocabulary and its transition tables (``states``), the schema and its migrations
(``schema``), which presets a worker may use (``preset_list``), when a context's keywords may
be shown (``keyword_reads``), the search cuts (``search``) and the text digest the core writes
and the worker compares (``text_fingerprint``).

Imports nothing of the platform's infrastructure (``db``, ``http``, ``cli``, ``logging``,
``settings_rules``), nor they of it (``tests/ops/test_package_boundaries.py``).
"""
