#!/bin/sh
# Runs once, when the compose database is first initialised (docker-entrypoint-initdb.d).
# Two login roles, neither of them the owner (POSTGRES_USER runs the migrations only):
# - pinlog_ai, a member of pinlog_ai_worker, whose privileges cover the ai schema only
#   (CONTRACT §8; 0004_worker_role.sql, 0022_worker_column_grants.sql);
# - pinlog_core, a member of pinlog_core_service (0023_core_service_role.sql).
# The migrations grant the privileges; the roles exist first so the grants find them.
set -eu
psql -v ON_ERROR_STOP=1 -v worker_password="$PINLOG_AI_DB_PASSWORD" \
    -v core_password="$PINLOG_CORE_DB_PASSWORD" \
    --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
CREATE ROLE pinlog_ai_worker NOLOGIN;
CREATE ROLE pinlog_ai LOGIN PASSWORD :'worker_password' IN ROLE pinlog_ai_worker;
CREATE ROLE pinlog_core_service NOLOGIN;
CREATE ROLE pinlog_core LOGIN PASSWORD :'core_password' IN ROLE pinlog_core_service;
SQL
