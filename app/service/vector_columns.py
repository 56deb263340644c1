"""Startup check: the vectors we store fit the database's vector columns (§1, §5).

The stored dimension is ``Settings.vector_dimension`` (model vectors shorter than it are
zero-padded, ``app.providers.padding``); it must equal every ai.* column's declared dimension,
otherwise each save would fail at the database. A column that declares none (the preset
vectors, one set per profile: 0050; the context vectors: 0060) takes any. A frozen column,
never written since its migration, binds nothing stored, so a profile of another dimension
may run beside it. Migrations are not edited to fit a model.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import ConfigurationError
from app.repository import vector_columns
from app.repository.db import autocommit

# pgvector's type modifier of a column declared without a dimension.
UNDECLARED = -1
# Vector columns nobody writes any more (frozen by 0050, to be dropped).
FROZEN_COLUMNS = frozenset({"keyword_preset.embedding"})


async def check_vector_columns(engine: AsyncEngine, stored_dimension: int) -> None:
    """``ConfigurationError`` naming the column when one is missing or of another dimension."""
    async with autocommit(engine) as conn:
        declared = await vector_columns.dimensions(conn)
    if not declared:
        raise ConfigurationError("no ai.* vector columns found: run `pinlog-ai db upgrade`")
    for name, dimension in declared.items():
        if name not in FROZEN_COLUMNS and dimension not in (stored_dimension, UNDECLARED):
            raise ConfigurationError(
                f"ai.{name} is VECTOR({dimension}) but vectors are stored with dimension "
                f"{stored_dimension} (PINLOG_VECTOR_DIMENSION)"
            )
