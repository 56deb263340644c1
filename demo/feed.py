"""The demo's client: the bundled notes go through the core service's client API (§9) as their
members would send them: creates, then edits (one whitespace-only), deletes and reads.

Members get bearer tokens the way ``pinlog-core token`` makes them (the member row is created
if it is new). Nothing here writes a state row: the core service does, and dispatches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from core_service.repository import member as member_repository
from core_service.repository.db import create_engine, transaction
from core_service.service.member_tokens import issue_token

SAMPLES = Path(__file__).with_name("sample_contexts.yaml")
TOKEN_TTL_SECONDS = 24 * 3600


@dataclass(frozen=True, slots=True)
class Sample:
    user_id: int
    record_id: int  # groups the notes of one member at one place in the file
    place: str
    text: str


@dataclass(frozen=True, slots=True)
class Edit:
    context: int  # position of the note in the file
    text: str


@dataclass(frozen=True, slots=True)
class Changes:
    """What happens after the creates (the ``changes`` section of the samples file)."""

    edits: tuple[Edit, ...] = ()
    whitespace_only_edits: tuple[int, ...] = ()
    context_deletes: tuple[int, ...] = ()
    record_deletes: tuple[int, ...] = ()
    views: tuple[int, ...] = ()


@dataclass
class ContextLine:
    """One context the demo created, and what became of it (``fate``)."""

    context_id: int
    member_id: int
    place: str
    text: str
    fate: str = "live"

    @property
    def live(self) -> bool:
        return self.fate == "live"


@dataclass
class FeedOutcome:
    lines: list[ContextLine] = field(default_factory=list)
    record_ids: list[int] = field(default_factory=list)  # core record id of each sample
    # the record's public id, by record id (what another member reads it by)
    public_ids: dict[int, str] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)  # one line per change, for the output


def load_samples(path: Path = SAMPLES) -> list[Sample]:
    entries = yaml.safe_load(path.read_text(encoding="utf-8"))["contexts"]
    return [Sample(e["user_id"], e["record_id"], e["place"], e["text"]) for e in entries]


def load_changes(path: Path = SAMPLES) -> Changes:
    raw = yaml.safe_load(path.read_text(encoding="utf-8")).get("changes") or {}
    return Changes(
        edits=tuple(Edit(e["context"], e["text"]) for e in raw.get("edits", ())),
        whitespace_only_edits=tuple(raw.get("whitespace_only_edits", ())),
        context_deletes=tuple(raw.get("context_deletes", ())),
        record_deletes=tuple(raw.get("record_deletes", ())),
        views=tuple(raw.get("views", ())),
    )


async def member_tokens(database_url: str, jwt_secret: str, member_ids: set[int]) -> dict[int, str]:
    """``{member_id: "Bearer ..."}``, creating members as ``pinlog-core token`` does."""
    engine = create_engine(database_url, pool_size=1)
    try:
        async with transaction(engine) as conn:
            for member_id in sorted(member_ids):
                await member_repository.ensure(conn, member_id)
    finally:
        await engine.dispose()
    return {
        member_id: "Bearer "
        + issue_token(member_id, secret=jwt_secret, ttl_seconds=TOKEN_TTL_SECONDS)
        for member_id in member_ids
    }


class DemoClient:
    """Calls the core's client API as the members of the samples."""

    def __init__(self, client: httpx.AsyncClient, tokens: dict[int, str]) -> None:
        self._client = client
        self._tokens = tokens

    async def call(self, method: str, path: str, member: int, body=None) -> httpx.Response:
        return await self._client.request(
            method, path, json=body, headers={"Authorization": self._tokens[member]}
        )

    async def feed(self, samples: list[Sample], changes: Changes) -> FeedOutcome:
        """Create every sample, then apply ``changes``; what became of every context."""
        outcome = FeedOutcome()
        for sample in samples:
            body = {"externalPlaceId": f"demo:{sample.place}", "placeName": sample.place}
            response = await self.call(
                "POST", "/api/v1/records", sample.user_id, {**body, "body": sample.text}
            )
            response.raise_for_status()
            created = response.json()
            outcome.record_ids.append(created["recordId"])
            outcome.public_ids[created["recordId"]] = created["publicId"]
            outcome.lines.append(
                ContextLine(created["contextId"], sample.user_id, sample.place, sample.text)
            )
        for edit in changes.edits:
            await self._edit(outcome, samples, edit.context, edit.text)
        for index in changes.whitespace_only_edits:
            await self._edit(outcome, samples, index, f"  {samples[index].text} \n")
        for index in changes.context_deletes:
            line = outcome.lines[index]
            response = await self.call(
                "DELETE", f"/api/v1/contexts/{line.context_id}", line.member_id
            )
            if response.status_code == 204:
                line.fate = "deleted"
            outcome.events.append(
                f"delete context {line.context_id}: {_status(response)}"
                + (" (the record's last active context)" if response.status_code == 409 else "")
            )
        for index in changes.record_deletes:
            record_id, member_id = outcome.record_ids[index], samples[index].user_id
            response = await self.call("DELETE", f"/api/v1/records/{record_id}", member_id)
            response.raise_for_status()
            for line, line_record in zip(outcome.lines, outcome.record_ids, strict=False):
                if line_record == record_id and line.live:
                    line.fate = "record deleted"
            outcome.events.append(f"delete record {record_id}: {_status(response)}")
        return outcome

    async def _edit(self, outcome: FeedOutcome, samples, index: int, text: str) -> None:
        line = outcome.lines[index]
        response = await self.call(
            "PUT", f"/api/v1/contexts/{line.context_id}", line.member_id, {"body": text}
        )
        response.raise_for_status()
        new_id = response.json()["contextId"]
        if new_id == line.context_id:
            outcome.events.append(
                f"whitespace-only edit of context {line.context_id}: same contextId, no-op"
            )
            return
        line.fate = f"replaced by {new_id}"
        outcome.lines.append(ContextLine(new_id, line.member_id, line.place, text))
        outcome.record_ids.append(outcome.record_ids[index])
        outcome.events.append(f"edit context {line.context_id}: new contextId {new_id}")

    async def keyword_views(
        self, record_id: int, public_id: str, owner: int, other: int
    ) -> tuple[list[str], list[str]]:
        """Display names of the record's keywords as its owner sees them (by record id) and as
        another member does (the public view, by public id: §9 keyword read rules, PRIVATE_ONLY
        only for the owner; a record id names only one's own record)."""
        views = []
        for member, path in (
            (owner, f"/api/v1/records/{record_id}"),
            (other, f"/api/v1/public-records/{public_id}"),
        ):
            response = await self.call("GET", path, member)
            response.raise_for_status()
            views.append([k["displayName"] for k in response.json()["keywords"]])
        return views[0], views[1]


def _status(response: httpx.Response) -> str:
    return f"{response.status_code} {response.reason_phrase}"
