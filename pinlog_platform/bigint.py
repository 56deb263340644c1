"""The range of PostgreSQL's ``bigint``, the type of every id of both services (§8).

A leaf both the contract (``contract/canonical_ids.py``) and the infrastructure
(``cli/numbers.py``) read: neither imports the other.
"""

# The largest id either service accepts; ids are 1..BIGINT_MAX.
BIGINT_MAX = 2**63 - 1
