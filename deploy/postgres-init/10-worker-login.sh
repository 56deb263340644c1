#!/bin/sh
# Runs once, when the compose database is first initialised (docker-entrypoint-initdb.d).
# The worker logs in as pinlog_ai, a member of pinlog_ai_worker, whose privileges cover the
# ai schema only (CONTRACT §8); the migrations grant them (0004_worker_role.sql).
set -eu
psql -v ON_ERROR_STOP=1 -v worker_password="$PINLOG_AI_DB_PASSWORD" \
    --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<'SQL'
CREATE ROLE pinlog_ai_worker NOLOGIN;
CREATE ROLE pinlog_ai LOGIN PASSWORD :'worker_password' IN ROLE pinlog_ai_worker;
SQL
