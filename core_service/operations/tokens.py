"""``pinlog-core token --member N``: a member's bearer token (docs/core-service.md "Client API").

The member is created when it does not exist; a withdrawn member gets no token (exit 1). The
token is signed as ``service/member_tokens.py`` verifies it.
"""

from __future__ import annotations

import typer

from core_service.command_startup import fail, load, run_operation
from core_service.composition import Operations
from core_service.repository import member as member_repository
from core_service.repository.db import transaction
from core_service.repository.member import MemberState
from core_service.service.member_tokens import issue_token
from pinlog_platform.cli import numbers

commands = typer.Typer(rich_markup_mode=None)


async def member_token(operations: Operations, member: int) -> str | None:
    """A token for ``member`` (created when it does not exist), valid for the settings'
    ``TOKEN_TTL_SECONDS``; ``None`` for a withdrawn member."""
    async with transaction(operations.engine) as conn:
        state = await member_repository.ensure(conn, member)
    if state is not MemberState.ACTIVE:
        return None
    settings = operations.settings
    return issue_token(
        member,
        secret=settings.jwt_secret.get_secret_value(),
        ttl_seconds=settings.token_ttl_seconds,
    )


@commands.command()
def token(
    member: int = typer.Option(
        ..., "--member", parser=numbers.whole(1), metavar="N", help="Member id"
    ),
) -> None:
    """Print a bearer token for member N (created if it does not exist), on one line."""
    from core_service.settings import TokenSettings

    issued = run_operation(load(TokenSettings), lambda ops: member_token(ops, member))
    if issued is None:
        fail(1, [f"member {member} has withdrawn; no token issued"])
    typer.echo(issued)
