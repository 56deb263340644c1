"""Fixtures of the worker tests beyond the suite's own (``tests/conftest.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from app.repository.db import register_vector_codec


@pytest.fixture
async def other_session(migrated_database: str) -> AsyncIterator[asyncpg.Connection]:
    """A separate plain asyncpg connection (with the vector codec): another worker's claim or
    save in a transaction of its own, held open as long as the test wants."""
    dsn = make_url(migrated_database).set(drivername="postgresql").render_as_string(False)
    conn = await asyncpg.connect(dsn)
    await register_vector_codec(conn)
    yield conn
    await conn.close()
