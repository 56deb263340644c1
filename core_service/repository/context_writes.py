"""The client API's context writes (§9), each one data-modifying statement.

A create, an add, an edit and the delete of one context each run as one statement in a short
transaction of its own (``pinlog_platform.db.transactions.single_statement``: ``BEGIN``, the
statement, ``COMMIT``), nothing half-written. Their sub-statements take rows in the
documented lock order (docs/lock-order.md) because every write selects from the CTE that locked
the row before it: ``member`` (``FOR SHARE``) -> place -> record -> old context -> new context ->
new state row -> old state row (``CANCELLED``) -> old embedding row (``is_deleted``).

Rows that another transaction changed after the statement's snapshot are re-read at their lock
(PostgreSQL's READ COMMITTED re-check of ``UPDATE`` and ``FOR UPDATE``), so a concurrent delete
or edit is seen once its lock is granted. A row another transaction *inserted* after the
snapshot is invisible to the same statement: a create that meets the member's record or the
place committed concurrently writes nothing and says so (``CreateOutcome.raced``); the service
then runs the step-by-step transaction, whose statements each take a new snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncConnection

from core_service.repository import member_daily_notes
from core_service.repository.context import INSERT_CONTEXT_COLUMNS
from core_service.repository.context_ai_state import (
    CANCEL_EVERY_STAGE,
    INSERT_PENDING_STATE_COLUMNS,
)
from core_service.repository.context_search import (
    NEW_SEARCH_TERMS,
    PURGED_SEARCH_TERMS,
    term_parameters,
)
from pinlog_platform.contract.search.terms import Terms
from pinlog_platform.contract.text_fingerprint import fingerprint

# How many replacements on a 409 follows at most: a longer chain names the last one reached,
# whose own 409 goes on (a chain grows by one per edit of the live end).
REPLACEMENT_CHAIN_LINKS = 64

# The daily note cap's day is the UTC calendar day (member_daily_notes): a time zone, not a status.
NON_STATUS_LITERALS = frozenset({"UTC"})

# The member's daily note (member_daily_notes), then the new context and its PENDING/PENDING/0
# state row, from a CTE `target` (record_id, origin_created_at) that holds at most one row;
# shared by the three statements below. The note is counted after the record's lock, and the
# context is written only when it was admitted (docs/lock-order.md).
_NEW_CONTEXT_AND_STATE = (
    member_daily_notes.DAILY_NOTE_CTE  # noqa: S608 (constant fragments)
    + """,
    new_context AS (
        INSERT INTO core.context """
    + INSERT_CONTEXT_COLUMNS
    + """
        SELECT target.record_id, CAST(:member_id AS bigint), CAST(:body AS text),
               target.origin_created_at
        FROM target
        WHERE """
    + member_daily_notes.NOTE_ADMITTED
    + """
        RETURNING id, record_id
    ),
    new_state AS (
        INSERT INTO ai.context_ai_state """
    + INSERT_PENDING_STATE_COLUMNS
    + """
        SELECT id, 'PENDING', 'PENDING', 0, now(), CAST(:member_id AS bigint), record_id,
               CAST(:text_sha256 AS bytea), true
        FROM new_context
        RETURNING context_id
    )"""
)

# The caller is an active member (read in the statement's snapshot, unlocked: the record's
# lock orders these writes against a withdrawal, which deletes the records). The add, modify
# and delete below answer "not active" from it, so the route verifies only the token.
_ACTIVE_MEMBER = """
    WITH member AS (
        SELECT id FROM core.member WHERE id = :member_id AND deleted_at IS NULL
    ),"""

# The caller's activity, then who owns the context :context_id and which record it is in,
# unlocked (the lock order needs the record first).
_ACTIVE_MEMBER_AND_OWNER = (
    _ACTIVE_MEMBER  # noqa: S608 (constant fragments)
    + """
    owner AS (
        SELECT record_id, member_id, deleted_at IS NOT NULL AS deleted, replaced_by
        FROM core.context WHERE id = :context_id
    ),"""
)

# The owner's record is the caller's and live, and so is the context as first read; the
# caller is an active member (the record's lock of an edit or a delete).
_CALLERS_LIVE_RECORD = """owner.member_id = :member_id AND NOT owner.deleted
          AND r.member_id = :member_id AND r.deleted_at IS NULL
          AND EXISTS (SELECT 1 FROM member)"""

# The context soft-deleted in a CTE `deleted` (id): its state CANCELLED, then its vector hidden,
# each selecting from the row locked before it (docs/lock-order.md); its search terms are
# purged beside them (context_search.PURGED_SEARCH_TERMS).
_CANCEL_DELETED = (
    """
    cancelled AS (
        UPDATE ai.context_ai_state AS s
        """  # noqa: S608 (constant fragments)
    + CANCEL_EVERY_STAGE
    + """
        FROM deleted WHERE s.context_id = deleted.id
        RETURNING s.context_id
    ),
    hidden AS (
        UPDATE ai.context_embedding AS e SET is_deleted = true, updated_at = now()
        FROM cancelled WHERE e.context_id = cancelled.context_id
    )"""
)

# A replaced context's answer names the live end of its replacement chain (each edit, and each
# `pinlog-core retry-failed` replacement, sets the old context's replaced_by): followed from
# the link `{first}` through at most :chain_links contexts of the caller, the farthest one
# reached, whether it is deleted, and whether the chain goes on past it (`next_id`). A link
# committed after the statement's snapshot (a concurrent edit this statement waited for) is
# not visible here: the caller then names `{first}` itself, the newest context it can know.
_REPLACEMENT_END = """
    LEFT JOIN LATERAL (
        WITH RECURSIVE chain (id, next_id, deleted, links) AS (
            SELECT c.id, c.replaced_by, c.deleted_at IS NOT NULL, 1
            FROM core.context AS c
            WHERE c.id = {first} AND c.member_id = :member_id
            UNION ALL
            SELECT c.id, c.replaced_by, c.deleted_at IS NOT NULL, chain.links + 1
            FROM chain JOIN core.context AS c ON c.id = chain.next_id
            WHERE chain.links < :chain_links AND c.member_id = :member_id
        )
        SELECT id, next_id, deleted FROM chain ORDER BY links DESC LIMIT 1
    ) AS chain_end ON true"""

# The chain's columns of the answer (with `_REPLACEMENT_END` joined).
_REPLACEMENT_COLUMNS = """{first} AS first_replacement, chain_end.id AS chain_end_id,
           (chain_end.deleted AND chain_end.next_id IS NULL) AS chain_end_deleted"""

# §9 Create: the active member (FOR SHARE: a concurrent withdrawal waits or is seen), the place
# (found, or inserted with this name), the member's active record of the place (touched, or
# inserted with the name this member gave; its public id is the column's default, 0090), then
# the context and its state row. Empty
# `member`: not active. `member` present but no record: a place or record inserted by a
# concurrent transaction after this statement's snapshot (module docstring).
CREATE_CONTEXT = text(
    """
    WITH member AS (
        SELECT id FROM core.member
        WHERE id = :member_id AND deleted_at IS NULL
        FOR SHARE
    ),
    found_place AS (
        SELECT id, name FROM core.place WHERE external_place_id = :external_place_id
    ),
    new_place AS (
        INSERT INTO core.place (external_place_id, name)
        SELECT CAST(:external_place_id AS varchar), CAST(:place_name AS varchar) FROM member
        WHERE NOT EXISTS (SELECT 1 FROM found_place)
        ON CONFLICT (external_place_id) DO NOTHING
        RETURNING id, name
    ),
    place AS (
        SELECT id, name FROM found_place UNION ALL SELECT id, name FROM new_place
    ),
    found_record AS (
        UPDATE core.record AS r SET updated_at = now()
        FROM member, place
        WHERE r.member_id = member.id AND r.place_id = place.id AND r.deleted_at IS NULL
        RETURNING r.id, r.public_id, coalesce(r.place_name, place.name) AS place_name,
                  false AS created
    ),
    new_record AS (
        INSERT INTO core.record (member_id, place_id, place_name)
        SELECT member.id, place.id, CAST(:place_name AS varchar) FROM member, place
        WHERE NOT EXISTS (SELECT 1 FROM found_record)
        ON CONFLICT (member_id, place_id) WHERE deleted_at IS NULL DO NOTHING
        RETURNING id, public_id, place_name, true AS created
    ),
    record AS (
        SELECT id, public_id, place_name, created FROM found_record
        UNION ALL SELECT id, public_id, place_name, created FROM new_record
    ),
    target AS (
        SELECT id AS record_id, now() AS origin_created_at FROM record
    ),"""  # noqa: S608 (constant fragments)
    + _NEW_CONTEXT_AND_STATE
    + ","
    + NEW_SEARCH_TERMS
    + """
    SELECT EXISTS (SELECT 1 FROM member) AS member_active,
           (EXISTS (SELECT 1 FROM target) AND NOT """
    + member_daily_notes.NOTE_ADMITTED
    + """) AS daily_cap_reached,
           record.id AS record_id, record.public_id, record.created AS record_created,
           record.place_name AS record_place_name, new_context.id AS context_id
    FROM (VALUES (1)) AS one
    LEFT JOIN record ON true
    LEFT JOIN new_context ON true
    """
)

# Add a context to an active record of the member: the record's lock (an UPDATE, which is also
# the ownership check), then the context and its state row. No row: missing, deleted or
# another member's record.
ADD_CONTEXT = text(
    _ACTIVE_MEMBER  # noqa: S608 (constant fragments)
    + """
    record AS (
        UPDATE core.record AS r SET updated_at = now()
        FROM core.place AS p, member
        WHERE r.id = :record_id AND r.member_id = member.id AND r.deleted_at IS NULL
          AND p.id = r.place_id
        RETURNING r.id, p.external_place_id, coalesce(r.place_name, p.name) AS place_name
    ),
    target AS (
        SELECT id AS record_id, now() AS origin_created_at FROM record
    ),"""
    + _NEW_CONTEXT_AND_STATE
    + ","
    + NEW_SEARCH_TERMS
    + """
    SELECT EXISTS (SELECT 1 FROM member) AS member_active,
           (EXISTS (SELECT 1 FROM target) AND NOT """
    + member_daily_notes.NOTE_ADMITTED
    + """) AS daily_cap_reached,
           record.external_place_id, record.place_name, new_context.id AS context_id
    FROM (VALUES (1)) AS one
    LEFT JOIN record ON true
    LEFT JOIN new_context ON true
    """
)

# The context that replaced the one to edit: as re-read at its lock, else as first read.
_MODIFY_FIRST_LINK = "coalesce(old.replaced_by, owner.replaced_by)"

# §9 Modify = create the new context, then delete the old one. `owner` reads the context
# unlocked (who owns it, which record); the record is locked next (FOR UPDATE, touched only
# when something changes), then the old context (FOR UPDATE: a concurrent edit or delete
# committed meanwhile is seen here). An unchanged body writes nothing. Otherwise the new
# context and state row (origin_created_at carried), the old context soft-deleted naming the
# new one as its replacement, its state CANCELLED, its vector hidden and its search terms
# purged, each selecting from the lock before it. A context found deleted answers with its
# replacement chain's end.
MODIFY_CONTEXT = text(
    _ACTIVE_MEMBER_AND_OWNER  # noqa: S608 (constant fragments)
    + """
    record AS (
        SELECT r.id, p.external_place_id, coalesce(r.place_name, p.name) AS place_name
        FROM owner
        JOIN core.record AS r ON r.id = owner.record_id
        JOIN core.place AS p ON p.id = r.place_id
        WHERE """
    + _CALLERS_LIVE_RECORD
    + """
        FOR UPDATE OF r
    ),
    old AS (
        SELECT c.id, c.body = CAST(:body AS text) AS unchanged, c.origin_created_at,
               c.deleted_at IS NOT NULL AS deleted, c.replaced_by
        FROM record JOIN core.context AS c ON c.id = :context_id
        FOR UPDATE OF c
    ),
    target AS (
        SELECT record.id AS record_id, old.origin_created_at
        FROM old, record
        WHERE NOT old.deleted AND NOT old.unchanged
    ),"""
    + _NEW_CONTEXT_AND_STATE
    + ","
    + NEW_SEARCH_TERMS
    + """,
    touched AS (
        UPDATE core.record AS r SET updated_at = now()
        FROM new_context WHERE r.id = new_context.record_id
    ),
    deleted AS (
        UPDATE core.context AS c SET deleted_at = now(), replaced_by = new_state.context_id
        FROM new_state WHERE c.id = :context_id
        RETURNING c.id
    ),"""
    + _CANCEL_DELETED
    + ","
    + PURGED_SEARCH_TERMS
    + """
    SELECT EXISTS (SELECT 1 FROM member) AS member_active,
           (EXISTS (SELECT 1 FROM target) AND NOT """
    + member_daily_notes.NOTE_ADMITTED
    + """) AS daily_cap_reached,
           owner.member_id = :member_id AS owned, owner.deleted AS owner_deleted,
           record.id IS NOT NULL AS record_active,
           record.external_place_id, record.place_name, record.id AS record_id,
           old.deleted AS old_deleted, old.unchanged, new_context.id AS new_id,
           """
    + _REPLACEMENT_COLUMNS.format(first=_MODIFY_FIRST_LINK)
    + """
    FROM (VALUES (1)) AS one
    LEFT JOIN owner ON true
    LEFT JOIN record ON true
    LEFT JOIN old ON true
    LEFT JOIN new_context ON true"""
    + _REPLACEMENT_END.format(first=_MODIFY_FIRST_LINK)
)


# The context that replaced the one to delete: as re-read at its lock, else as first read.
_DELETE_FIRST_LINK = (
    "coalesce((SELECT replaced_by FROM contexts WHERE id = :context_id), owner.replaced_by)"
)

# §9 Delete of one context: `owner` unlocked, the record locked (the last-context guard runs
# under it), then the record's contexts that are active, and the one to delete whatever its
# state, locked in id order; a context deleted by a transaction that committed while this one
# waited is re-read at its lock and no longer counts. The context is soft-deleted only while
# another active one remains; then its state is CANCELLED, its vector hidden and its search
# terms purged. A context
# found deleted answers with its replacement chain's end.
DELETE_CONTEXT = text(
    _ACTIVE_MEMBER_AND_OWNER  # noqa: S608 (constant fragments)
    + """
    record AS (
        SELECT r.id
        FROM owner JOIN core.record AS r ON r.id = owner.record_id
        WHERE """
    + _CALLERS_LIVE_RECORD
    + """
        FOR UPDATE OF r
    ),
    contexts AS (
        SELECT c.id, c.deleted_at IS NULL AS active, c.replaced_by
        FROM record JOIN core.context AS c ON c.record_id = record.id
        WHERE c.deleted_at IS NULL OR c.id = :context_id
        ORDER BY c.id
        FOR UPDATE OF c
    ),
    target AS (
        SELECT id FROM contexts
        WHERE id = :context_id AND active
          AND (SELECT count(*) FROM contexts WHERE active) > 1
    ),
    deleted AS (
        UPDATE core.context AS c SET deleted_at = now()
        FROM target WHERE c.id = target.id
        RETURNING c.id
    ),
"""
    + _CANCEL_DELETED
    + ","
    + PURGED_SEARCH_TERMS
    + """
    SELECT EXISTS (SELECT 1 FROM member) AS member_active,
           owner.member_id = :member_id AS owned, owner.deleted AS owner_deleted,
           EXISTS (SELECT 1 FROM record) AS record_active,
           (SELECT NOT active FROM contexts WHERE id = :context_id) AS old_deleted,
           EXISTS (SELECT 1 FROM deleted) AS deleted,
           """
    + _REPLACEMENT_COLUMNS.format(first=_DELETE_FIRST_LINK)
    + """
    FROM (VALUES (1)) AS one
    LEFT JOIN owner ON true"""
    + _REPLACEMENT_END.format(first=_DELETE_FIRST_LINK)
)


@dataclass(frozen=True, slots=True)
class CreateOutcome:
    """What ``create`` did. ``member_active`` False: nothing written (401). ``raced``: the
    member is active but a place or record committed concurrently was not visible; nothing
    written, run the step-by-step path. ``daily_cap_reached``: the member's daily note cap
    refused the context (a record may have been written: roll back). Otherwise the record
    (``record_created``: inserted now), its ``public_id``, the name its owner gave, and the new
    context."""

    member_active: bool
    daily_cap_reached: bool = False
    record_id: int | None = None
    public_id: str = ""
    record_created: bool = False
    record_place_name: str = ""
    context_id: int | None = None

    @property
    def raced(self) -> bool:
        return self.member_active and self.context_id is None and not self.daily_cap_reached


@dataclass(frozen=True, slots=True)
class AddedContext:
    """``member_active`` False: nothing written (401); ``daily_cap_reached``: the daily note
    cap refused the context; ``context_id`` None: no active record of this member has that id
    (404)."""

    member_active: bool
    daily_cap_reached: bool = False
    context_id: int | None = None
    external_place_id: str = ""
    place_name: str = ""


@dataclass(frozen=True, slots=True)
class ExistingContextLocks:
    """What a statement on an existing context (``modify``, ``delete``) found, in the order it
    locked the rows.

    ``member_active`` False: the caller is not an active member, nothing written (401).
    ``owned`` None: the context never existed; False: another member's. ``owner_deleted``: it
    was deleted before this statement began. ``record_active`` False: its record is deleted.
    ``old_deleted``: deleted by a transaction that committed while this one waited for its
    locks. A deleted context that was replaced (an edit, ``retry-failed``): ``replaced_by`` is
    the end of its replacement chain (at most ``REPLACEMENT_CHAIN_LINKS`` on; the replacement
    itself when the statement's snapshot cannot see it), ``replacement_deleted`` whether that
    end is deleted; ``None`` for a context deleted without a replacement (or edited before the
    edit recorded it).
    """

    member_active: bool
    owned: bool | None
    owner_deleted: bool = False
    record_active: bool = False
    old_deleted: bool = False
    replaced_by: int | None = None
    replacement_deleted: bool = False


@dataclass(frozen=True, slots=True)
class ModifyOutcome(ExistingContextLocks):
    """``unchanged``: same body, nothing written. ``daily_cap_reached``: the daily note cap
    refused the new context (nothing written). ``new_id``: the new context, in ``record_id`` at
    the place the record's owner named."""

    daily_cap_reached: bool = False
    record_id: int | None = None
    external_place_id: str = ""
    place_name: str = ""
    unchanged: bool = False
    new_id: int | None = None


@dataclass(frozen=True, slots=True)
class DeleteOutcome(ExistingContextLocks):
    """``deleted``: the context was soft-deleted (False with every check passed: it was the
    record's last active context, nothing written)."""

    deleted: bool = False


async def create(
    conn: AsyncConnection,
    *,
    member_id: int,
    external_place_id: str,
    place_name: str,
    body: str,
    daily_notes: int,
    terms: Terms,
    analyser_version: str,
) -> CreateOutcome:
    """Run ``CREATE_CONTEXT``. Inputs are normalised already; ``body`` is the stored text,
    ``terms`` its search terms (``pinlog_platform.contract.search.terms``); ``daily_notes``
    is the member's daily note cap (0 = off)."""
    row = (
        await conn.execute(
            CREATE_CONTEXT,
            {
                "member_id": member_id,
                "external_place_id": external_place_id,
                "place_name": place_name,
                "body": body,
                "text_sha256": fingerprint(body),
                "daily_notes": daily_notes,
            }
            | term_parameters(terms, analyser_version),
        )
    ).one()
    if row.context_id is None:
        return CreateOutcome(
            member_active=bool(row.member_active), daily_cap_reached=bool(row.daily_cap_reached)
        )
    return CreateOutcome(
        member_active=True,
        record_id=int(row.record_id),
        public_id=row.public_id,
        record_created=bool(row.record_created),
        record_place_name=row.record_place_name,
        context_id=int(row.context_id),
    )


async def add(
    conn: AsyncConnection,
    *,
    member_id: int,
    record_id: int,
    body: str,
    daily_notes: int,
    terms: Terms,
    analyser_version: str,
) -> AddedContext:
    """Run ``ADD_CONTEXT`` (``daily_notes``: the daily note cap, 0 = off; ``terms``: the
    body's search terms)."""
    row = (
        await conn.execute(
            ADD_CONTEXT,
            {
                "member_id": member_id,
                "record_id": record_id,
                "body": body,
                "text_sha256": fingerprint(body),
                "daily_notes": daily_notes,
            }
            | term_parameters(terms, analyser_version),
        )
    ).one()
    if row.context_id is None:
        return AddedContext(
            member_active=bool(row.member_active), daily_cap_reached=bool(row.daily_cap_reached)
        )
    return AddedContext(
        member_active=True,
        context_id=int(row.context_id),
        external_place_id=row.external_place_id,
        place_name=row.place_name,
    )


async def modify(
    conn: AsyncConnection,
    *,
    member_id: int,
    context_id: int,
    body: str,
    daily_notes: int,
    terms: Terms,
    analyser_version: str,
) -> ModifyOutcome:
    """Run ``MODIFY_CONTEXT`` with the normalised new ``body`` and its search terms
    (``daily_notes``: the daily note cap, 0 = off; an edit that writes a new context counts as
    a note)."""
    row = (
        await conn.execute(
            MODIFY_CONTEXT,
            {
                "member_id": member_id,
                "context_id": context_id,
                "body": body,
                "text_sha256": fingerprint(body),
                "daily_notes": daily_notes,
                "chain_links": REPLACEMENT_CHAIN_LINKS,
            }
            | term_parameters(terms, analyser_version),
        )
    ).one()
    return ModifyOutcome(
        member_active=bool(row.member_active),
        daily_cap_reached=bool(row.daily_cap_reached),
        owned=None if row.owned is None else bool(row.owned),
        owner_deleted=bool(row.owner_deleted),
        record_active=bool(row.record_active),
        record_id=row.record_id,
        external_place_id=row.external_place_id or "",
        place_name=row.place_name or "",
        old_deleted=bool(row.old_deleted),
        unchanged=bool(row.unchanged),
        new_id=row.new_id,
        **_replacement(row),
    )


async def delete(conn: AsyncConnection, *, member_id: int, context_id: int) -> DeleteOutcome:
    """Run ``DELETE_CONTEXT``."""
    params = {
        "member_id": member_id,
        "context_id": context_id,
        "chain_links": REPLACEMENT_CHAIN_LINKS,
    }
    row = (await conn.execute(DELETE_CONTEXT, params)).one()
    return DeleteOutcome(
        member_active=bool(row.member_active),
        owned=None if row.owned is None else bool(row.owned),
        owner_deleted=bool(row.owner_deleted),
        record_active=bool(row.record_active),
        old_deleted=bool(row.old_deleted),
        deleted=bool(row.deleted),
        **_replacement(row),
    )


def _replacement(row: Row) -> dict[str, object]:
    """``replaced_by`` and ``replacement_deleted`` of ``ExistingContextLocks`` from the chain's
    columns (``_REPLACEMENT_COLUMNS``)."""
    if row.first_replacement is None:
        return {"replaced_by": None, "replacement_deleted": False}
    if row.chain_end_id is None:  # the replacement committed after the snapshot
        return {"replaced_by": int(row.first_replacement), "replacement_deleted": False}
    return {
        "replaced_by": int(row.chain_end_id),
        "replacement_deleted": bool(row.chain_end_deleted),
    }
