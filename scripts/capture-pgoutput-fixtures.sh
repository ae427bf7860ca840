#!/usr/bin/env bash
# Captures pgoutput protocol v1 messages from a real PostgreSQL into
# tests/fixtures/pgoutput/ (PostgreSQL 15) or tests/fixtures/pgoutput-<major>/
# (14, 16, 17, 18), one file per message, plus a MANIFEST.
#
# The common part (server checks, one file per message, MANIFEST) is
# scripts/lib/capture-pgoutput.sh; scripts/capture-pgoutput-stream-fixtures.sh
# captures protocol 2's streamed transactions the same way.
#
# Usage: OUTBOX_CDC_TEST_PG_ADMIN=postgres://postgres@127.0.0.1:54339/postgres \
#        scripts/capture-pgoutput-fixtures.sh [output-dir]
# e.g. after `OUTBOX_CDC_PG_VERSION=17 scripts/env.sh up && . target/env/test.env`.
# The superuser URL must point at a cluster with wal_level=logical, PostgreSQL 14
# or later (13's pgoutput has no logical decoding messages, which the workload
# needs). tests/it/pgoutput_golden.rs asserts the exact decoded content of every
# set, so changing the workload here means updating that test and capturing
# every set again.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

ADMIN="${OUTBOX_CDC_TEST_PG_ADMIN:?set OUTBOX_CDC_TEST_PG_ADMIN to a superuser URL of the test cluster}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-}"

SCHEMA=pgoutput_fixture
PUB=pgoutput_fixture_pub
SLOT=pgoutput_fixture_slot
ORIGIN=pgoutput_fixture_origin

# shellcheck source=lib/capture-pgoutput.sh
. "$ROOT/scripts/lib/capture-pgoutput.sh"

capture_check_server
if [ -z "$OUT" ]; then
    if [ "$major" = 15 ]; then OUT="$ROOT/tests/fixtures/pgoutput"; else OUT="$ROOT/tests/fixtures/pgoutput-$major"; fi
fi

cleanup() {
    capture_cleanup
    sql >/dev/null -c "SELECT pg_replication_origin_drop('$ORIGIN') FROM pg_replication_origin WHERE roname = '$ORIGIN'" || true
}
cleanup
trap cleanup EXIT

# Tables first, then the publication, then the slot: pgoutput looks the
# publication up with the historic snapshot of each decoded change.
sql >/dev/null <<SQL
CREATE SCHEMA $SCHEMA;
CREATE TYPE $SCHEMA.mood AS ENUM ('sad', 'ok', 'happy');
-- default replica identity (primary key): 'K' old keys only when the key changes
CREATE TABLE $SCHEMA.accounts (
    id      integer PRIMARY KEY,
    name    varchar(40) NOT NULL,
    balance numeric(12,2),
    mood    $SCHEMA.mood,
    note    text
);
-- REPLICA IDENTITY FULL: 'O' whole old rows on update and delete
CREATE TABLE $SCHEMA.events (id bigint, payload text);
ALTER TABLE $SCHEMA.events REPLICA IDENTITY FULL;
-- STORAGE EXTERNAL keeps a 4 kB body out of line and uncompressed, so an
-- update of another column sends it as 'u' (unchanged TOAST)
CREATE TABLE $SCHEMA.docs (id integer PRIMARY KEY, title text, body text);
ALTER TABLE $SCHEMA.docs ALTER COLUMN body SET STORAGE EXTERNAL;
-- not published: committing a write here flushes WAL (see step)
CREATE TABLE $SCHEMA.wal_flush (n integer);
CREATE PUBLICATION $PUB FOR TABLE $SCHEMA.accounts, $SCHEMA.events, $SCHEMA.docs;
SELECT pg_create_logical_replication_slot('$SLOT', 'pgoutput');
SELECT pg_replication_origin_create('$ORIGIN');
SQL

capture_start "$OUT" "pgoutput proto_version 1 messages captured by scripts/capture-pgoutput-fixtures.sh"

step() {
    sql >/dev/null # the step's SQL comes on stdin
    capture_consume "$1" "SELECT lsn, xid, encode(data, 'hex')
        FROM pg_logical_slot_get_binary_changes('$SLOT', NULL, NULL,
            'proto_version', '1', 'publication_names', '$PUB', 'messages', 'true')"
}

step insert_accounts <<SQL
INSERT INTO $SCHEMA.accounts VALUES
    (1, 'alice', 100.50, 'happy', NULL),
    (2, 'zoë', 0, 'sad', 'has a note');
SQL

step update_accounts <<SQL
BEGIN;
UPDATE $SCHEMA.accounts SET balance = 90.25 WHERE id = 1;
UPDATE $SCHEMA.accounts SET id = 20 WHERE id = 2;
COMMIT;
SQL

step full_identity <<SQL
BEGIN;
INSERT INTO $SCHEMA.events VALUES (1, 'created');
UPDATE $SCHEMA.events SET payload = 'updated' WHERE id = 1;
DELETE FROM $SCHEMA.events WHERE id = 1;
COMMIT;
SQL

step delete_account <<SQL
DELETE FROM $SCHEMA.accounts WHERE id = 20;
SQL

step insert_doc <<SQL
INSERT INTO $SCHEMA.docs VALUES (1, 'v1', repeat('0123456789abcdef', 256));
SQL

step update_doc_title <<SQL
UPDATE $SCHEMA.docs SET title = 'v2' WHERE id = 1;
SQL

step add_column <<SQL
ALTER TABLE $SCHEMA.accounts ADD COLUMN email text;
SQL

step insert_after_alter <<SQL
INSERT INTO $SCHEMA.accounts (id, name, balance, mood, email)
    VALUES (3, 'carol', 7, 'ok', 'carol@example.com');
SQL

step truncate <<SQL
TRUNCATE $SCHEMA.events, $SCHEMA.docs RESTART IDENTITY CASCADE;
SQL

step tx_messages <<SQL
BEGIN;
INSERT INTO $SCHEMA.accounts (id, name) VALUES (4, 'dave');
SELECT pg_logical_emit_message(true, 'fixture', 'hello from a transaction');
SELECT pg_logical_emit_message(true, 'fixture-bin', '\x00ff01'::bytea);
COMMIT;
SQL

step non_tx_message <<SQL
SELECT pg_logical_emit_message(false, 'fixture', 'outside any transaction');
SQL

step rollback <<SQL
BEGIN;
INSERT INTO $SCHEMA.accounts (id, name) VALUES (99, 'never');
SELECT pg_logical_emit_message(true, 'fixture', 'never sent');
DELETE FROM $SCHEMA.accounts WHERE id = 1;
ROLLBACK;
SQL

step after_rollback <<SQL
INSERT INTO $SCHEMA.accounts (id, name) VALUES (5, 'erin');
SQL

# A change applied through a replication origin (as a subscription's apply
# worker does): pgoutput sends 'O' (origin name, the origin's commit LSN) right
# after Begin. PostgreSQL 15's pgoutput has no `origin` option and filters
# nothing by origin; 16+ would need origin 'any' (the default). Logical
# decoding reports the origin's commit time (2001) in Begin and Commit.
step origin <<SQL
SELECT pg_replication_origin_session_setup('$ORIGIN');
BEGIN;
SELECT pg_replication_origin_xact_setup('1/23456789', '2001-02-03 04:05:06+00');
INSERT INTO $SCHEMA.accounts (id, name) VALUES (6, 'frank');
COMMIT;
SELECT pg_replication_origin_session_reset();
SQL

echo "capture: wrote $seq messages to $OUT"
