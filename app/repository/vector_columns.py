"""Declared dimensions of the ai schema's ``vector`` columns, read from the catalog (§1, §5)."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Each ai.* vector column as 'table.column' with its declared dimension (pgvector keeps the
# dimension in atttypmod; -1 means none was declared).
VECTOR_COLUMN_DIMENSIONS = text(
    """
    SELECT c.relname || '.' || a.attname AS name, a.atttypmod AS dimension
    FROM pg_attribute AS a
    JOIN pg_class AS c ON c.oid = a.attrelid
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    JOIN pg_type AS t ON t.oid = a.atttypid
    WHERE n.nspname = 'ai' AND t.typname = 'vector' AND a.attnum > 0 AND NOT a.attisdropped
    ORDER BY name
    """
)


async def dimensions(conn: AsyncConnection) -> dict[str, int]:
    """``{'context_embedding.embedding': 1536, ...}``, ``-1`` for a column that declares no
    dimension; empty before the schema exists."""
    rows = await conn.execute(VECTOR_COLUMN_DIMENSIONS)
    return {row.name: int(row.dimension) for row in rows}
