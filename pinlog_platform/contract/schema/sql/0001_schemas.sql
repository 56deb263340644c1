-- Schemas and the vector extension (CONTRACT §0, §1). Mirror of the core side's migrations.
CREATE EXTENSION IF NOT EXISTS vector;
CREATE SCHEMA IF NOT EXISTS core;
CREATE SCHEMA IF NOT EXISTS ai;
