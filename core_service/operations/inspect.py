"""``pinlog-core inspect CONTEXT_ID [--json] [--show-text]``: one note as an operator needs to
see it (docs/operations.md "Looking at one note"): both stages (status, attempts, failure
reason), the state row's times and retry budget, the last dispatch a worker took (time,
worker, outcome: ``accepted``, ``timed_out`` or the worker's verdict such as ``HTTP 422``;
refused dispatches are in the metrics only), the judgment (the candidates with their cosine
similarity, the selected keywords with confidence, the model, the preset list version, the
unmatched concepts) and the vectors by profile. Read-only, one statement
(``core_service/repository/context_inspection.py``). The note's text is shown only with
``--show-text``. What was written before its column existed (candidates, last dispatch) shows
``not recorded``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import typer

from core_service.command_startup import fail, load, run_operation
from core_service.composition import Operations
from core_service.repository import context_inspection
from core_service.repository.db import autocommit
from pinlog_platform.cli import numbers
from pinlog_platform.contract.states import STAGE_ORDER

NOT_RECORDED = "not recorded"
# Exit status when the context does not exist (a refusal, like reembed's).
NO_SUCH_CONTEXT = 1

commands = typer.Typer(rich_markup_mode=None)


async def inspect_context(
    operations: Operations, context_id: int, *, show_text: bool
) -> dict[str, Any] | None:
    """The inspection report of ``context_id`` as a JSON-ready dict (times ISO 8601, UTC),
    ``None`` when no such context exists. Keys: ``contextId``, ``recordId``, ``memberId``,
    ``live``, ``createdAt``, ``deletedAt``, ``replacedBy``, ``stages`` (one per stage:
    ``status``, ``attempts``, ``failure``), ``state`` (``retryCount``, ``updatedAt``,
    ``rescannedAt``, ``firstDispatchTakenAt``, ``nextDispatchAt``), ``lastDispatch`` (``at``,
    ``worker``, ``outcome``; ``"not recorded"`` when none), ``judgment`` (``None`` before one;
    else ``candidates``, ``selected``, ``model``, ``presetVersion``, ``embeddingProfile``,
    ``unmatchedConcepts``, ``judgedAt``), ``vectors``; ``text`` only with ``show_text``."""
    async with autocommit(operations.engine) as conn:
        row = await context_inspection.inspect(conn, context_id, with_text=show_text)
    return None if row is None else report(row, show_text=show_text)


def report(row: Mapping[str, Any], *, show_text: bool) -> dict[str, Any]:
    """The JSON-ready report of one ``context_inspection.inspect`` row."""
    live = (
        row["deleted_at"] is None
        and row["record_deleted_at"] is None
        and row["member_deleted_at"] is None
    )
    out: dict[str, Any] = {
        "contextId": row["context_id"],
        "recordId": row["record_id"],
        "memberId": row["member_id"],
        "live": live,
        "createdAt": _time(row["created_at"]),
        "deletedAt": _time(row["deleted_at"]),
        "replacedBy": row["replaced_by"],
    }
    if not row["has_state"]:
        out["stages"] = None
        out["state"] = None
        out["lastDispatch"] = NOT_RECORDED
    else:
        columns = row["stages"]
        out["stages"] = {
            stage.label: {
                "status": columns[stage.status_column],
                "attempts": columns[stage.attempt_column],
                "failure": columns[stage.failure_column],
            }
            for stage in STAGE_ORDER
        }
        out["state"] = {
            "retryCount": row["retry_count"],
            "updatedAt": _time(row["state_updated_at"]),
            "rescannedAt": _time(row["rescanned_at"]),
            "firstDispatchTakenAt": _time(row["dispatch_accepted_at"]),
            "nextDispatchAt": _time(row["next_dispatch_at"]),
        }
        out["lastDispatch"] = (
            NOT_RECORDED
            if row["last_dispatch_at"] is None
            else {
                "at": _time(row["last_dispatch_at"]),
                "worker": row["last_dispatch_worker"],
                "outcome": row["last_dispatch_outcome"],
            }
        )
    out["judgment"] = (
        None
        if not row["has_judgment"]
        else {
            "candidates": NOT_RECORDED if row["candidates"] is None else row["candidates"],
            "selected": [
                {**item, "confidence": float(item["confidence"])} for item in row["selected"] or []
            ],
            "model": row["model_profile"],
            "presetVersion": row["preset_version"],
            "embeddingProfile": row["judged_profile"],
            "unmatchedConcepts": list(row["unmatched_concepts"] or []),
            "judgedAt": _time(row["judged_at"]),
        }
    )
    out["vectors"] = row["vectors"] or []
    if show_text:
        out["text"] = row["body"]
    return out


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def render(report: Mapping[str, Any]) -> list[str]:
    """The report as the lines ``inspect`` prints without ``--json``."""
    lines = [
        f"context {report['contextId']}: record {report['recordId']}, member "
        f"{report['memberId']}, {'live' if report['live'] else 'not live'}",
        f"  created {report['createdAt']}"
        + (f", deleted {report['deletedAt']}" if report["deletedAt"] else "")
        + (f", replaced by {report['replacedBy']}" if report["replacedBy"] else ""),
    ]
    if report["stages"] is None:
        lines.append("  no state row")
    else:
        for label, stage in report["stages"].items():
            failure = f", failed: {stage['failure']}" if stage["failure"] else ""
            lines.append(f"  {label}: {stage['status']}, attempts {stage['attempts']}{failure}")
        state = report["state"]
        lines.append(
            f"  retries spent {state['retryCount']}; state updated {state['updatedAt']}; "
            f"first dispatch taken {state['firstDispatchTakenAt'] or 'never'}; "
            f"rescanned {state['rescannedAt'] or 'never'}"
        )
    last = report["lastDispatch"]
    if isinstance(last, str):
        lines.append(f"  last dispatch: {last}")
    else:
        lines.append(f"  last dispatch: {last['at']} to {last['worker']}: {last['outcome']}")
    judgment = report["judgment"]
    if judgment is None:
        lines.append("  judgment: none yet")
    else:
        lines.append(
            f"  judgment: {judgment['judgedAt']} by {judgment['model']}, preset list "
            f"{judgment['presetVersion']}, presets of {judgment['embeddingProfile']}"
        )
        candidates = judgment["candidates"]
        if isinstance(candidates, str):
            lines.append(f"    candidates: {candidates}")
        else:
            lines.append(
                "    candidates: "
                + (", ".join(f"{c['code']} {c['similarity']:.3f}" for c in candidates) or "none")
            )
        lines.append(
            "    selected: "
            + (
                ", ".join(f"{s['code']} {s['confidence']:.3f}" for s in judgment["selected"])
                or "none"
            )
        )
        lines.append(
            "    unmatched concepts: " + (", ".join(judgment["unmatchedConcepts"]) or "none")
        )
    vectors = report["vectors"]
    lines.append(
        "  vectors: "
        + (
            ", ".join(f"{v['profile']}" + (" (deleted)" if v["deleted"] else "") for v in vectors)
            or "none"
        )
    )
    if "text" in report:
        lines.append(f"  text: {report['text']}")
    return lines


@commands.command("inspect")
def inspect_command(
    # Hidden from the Arguments table, which would print its type; the usage line and the
    # text below name it.
    context_id: int = typer.Argument(
        ..., metavar="CONTEXT_ID", parser=numbers.whole(1), hidden=True
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object"),
    show_text: bool = typer.Option(
        False, "--show-text", help="Also print the note's text (a member's words: only when needed)"
    ),
) -> None:
    """One note, CONTEXT_ID: both stages, the last dispatch a worker took, the judgment with
    its candidates, the vectors by profile. No note text unless --show-text. Exit 1 when no
    such context."""
    from core_service.settings import CoreDatabaseSettings

    settings = load(CoreDatabaseSettings)
    result = run_operation(
        settings, lambda ops: inspect_context(ops, context_id, show_text=show_text)
    )
    if result is None:
        fail(NO_SUCH_CONTEXT, [f"no context {context_id}"])
    if as_json:
        typer.echo(json.dumps(result, ensure_ascii=False))
        return
    for line in render(result):
        typer.echo(line)
