#!/usr/bin/env bash
# Captures pgoutput protocol 2 streams of in-progress transactions from a real
# PostgreSQL into tests/fixtures/pgoutput-stream-<major>/ (14 to 18), one file
# per message, plus a MANIFEST (the common part is scripts/lib/capture-pgoutput.sh).
#
# The decoding runs with proto_version 2, streaming on, and the smallest
# logical_decoding_work_mem (64kB, set in the decoding session): a transaction
# whose decoded changes outgrow it is sent while in progress, in blocks (Stream
# Start .. Stream Stop), and ends in Stream Commit or Stream Abort. Each row
# carries a 6800-byte text stored PLAIN (in line, uncompressed), so nine rows
# stay under the limit and the tenth goes over: a handful of rows is enough.
# Each step is decoded by one call of the slot function, so a transaction is
# decoded by one decoding context from its first change to its end (a second
# call would decode it again from the slot's restart point).
#
# Steps:
#   interleaved         transaction A writes rows 1..10 (streamed: block 1) and
#                       stays open; another session commits row 100 (transaction
#                       B, small, sent whole after block 1); A writes 11..12 and
#                       commits (block 2, Stream Commit)
#   savepoint_rollback  row 201, then SAVEPOINT and rows 211..219 (streamed with
#                       201), ROLLBACK TO the savepoint (Stream Abort of the
#                       subtransaction), row 202 (in a new subtransaction: the
#                       savepoint stays), COMMIT
#   late_rollback       rows 401..410, ROLLBACK (up to 17, Stream Abort of the
#                       whole transaction after a block without changes; 18
#                       sends nothing; see below)
#   rollback            row 300 committed, then rows 301..310 (streamed),
#                       ROLLBACK (Stream Abort of the whole transaction; on 18
#                       every row in a block of its own, see below)
#
# Usage: OUTBOX_CDC_TEST_PG_ADMIN=postgres://postgres@127.0.0.1:54339/postgres \
#        scripts/capture-pgoutput-stream-fixtures.sh [output-dir]
# e.g. after `OUTBOX_CDC_PG_VERSION=17 scripts/env.sh up && . target/env/test.env`.
# tests/it/pgoutput_stream_golden.rs asserts the exact structure and rows of
# every set, so changing the workload here means updating that test and
# capturing every set again.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

ADMIN="${OUTBOX_CDC_TEST_PG_ADMIN:?set OUTBOX_CDC_TEST_PG_ADMIN to a superuser URL of the test cluster}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-}"

SCHEMA=pgoutput_stream_fixture
PUB=pgoutput_stream_fixture_pub
SLOT=pgoutput_stream_fixture_slot
BODY_BYTES=6800

# shellcheck source=lib/capture-pgoutput.sh
. "$ROOT/scripts/lib/capture-pgoutput.sh"

capture_check_server
OUT="${OUT:-$ROOT/tests/fixtures/pgoutput-stream-$major}"

capture_cleanup
trap capture_cleanup EXIT

sql >/dev/null <<SQL
CREATE SCHEMA $SCHEMA;
CREATE TABLE $SCHEMA.rows (id integer PRIMARY KEY, body text);
ALTER TABLE $SCHEMA.rows ALTER COLUMN body SET STORAGE PLAIN;
CREATE TABLE $SCHEMA.wal_flush (n integer);
CREATE PUBLICATION $PUB FOR TABLE $SCHEMA.rows;
SELECT pg_create_logical_replication_slot('$SLOT', 'pgoutput');
SQL

capture_start "$OUT" "pgoutput proto_version 2 streaming messages captured by scripts/capture-pgoutput-stream-fixtures.sh"

# logical_decoding_work_mem is a user setting: SET in the decoding session.
CHANGES_SQL="SET logical_decoding_work_mem = '64kB';
SELECT lsn, xid, encode(data, 'hex')
    FROM pg_logical_slot_get_binary_changes('$SLOT', NULL, NULL,
        'proto_version', '2', 'streaming', 'on', 'publication_names', '$PUB')"

# rows FIRST LAST: the INSERT of rows FIRST..LAST, each body 'row <id>' padded.
rows() {
    echo "INSERT INTO $SCHEMA.rows
    SELECT i, rpad('row ' || i, $BODY_BYTES, '.') FROM generate_series($1, $2) AS i;"
}

step() {
    sql >/dev/null # the step's SQL comes on stdin
    capture_consume "$1" "$CHANGES_SQL"
}

# Transaction A runs in its own psql, fed line by line; `\echo MARKER` comes
# back once everything sent before it has run.
coproc SESSION_A { sql; }
a_pid=$SESSION_A_PID
a_run() { # a_run MARKER SQL...
    local marker=$1 line
    shift
    printf '%s\n' "$@" "\\echo $marker" >&"${SESSION_A[1]}"
    while IFS= read -r -t 60 line <&"${SESSION_A[0]}"; do
        if [ "$line" = "$marker" ]; then return 0; fi
    done
    echo "capture: transaction A's session did not get to $marker" >&2
    exit 1
}
a_run a_open "BEGIN;" "$(rows 1 10)"
# B commits while A is open: its Begin..Commit comes between A's blocks.
sql -c "INSERT INTO $SCHEMA.rows VALUES (100, 'small')"
a_run a_committed "$(rows 11 12)" "COMMIT;"
a_in=${SESSION_A[1]}
exec {a_in}>&-
wait "$a_pid"
capture_consume interleaved "$CHANGES_SQL"

step savepoint_rollback <<SQL
BEGIN;
$(rows 201 201)
SAVEPOINT doomed;
$(rows 211 219)
ROLLBACK TO SAVEPOINT doomed;
$(rows 202 202)
COMMIT;
SQL

# Decoded after its ROLLBACK by a new backend, the transaction is streamed
# all the same (its changes outgrow the limit), but the first catalog lookup
# of the block finds it aborted (the check behind "transaction aborted during
# system catalog scan") and the block is closed at once: Stream Start, Stream
# Stop, Stream Abort, no change. A walsender decoding a backlog does the same.
step late_rollback <<SQL
BEGIN;
$(rows 401 410)
ROLLBACK;
SQL

# A live walsender streams a block before the ROLLBACK is written. Decoded
# after it, the block keeps its changes only if the lookups it needs are
# cached by then: the committed row 300, decoded first in the same call,
# warms the caches (relation, publication, type output) of the table.
# PostgreSQL 18 checks a transaction that outgrows the limit for an abort
# first and drops its changes unsent (late_rollback sends nothing at all);
# only debug_logical_replication_streaming = immediate skips that check, and
# it streams every change as it comes, row 300's transaction included.
rollback_sql="$CHANGES_SQL"
if [ "$major" -ge 18 ]; then
    rollback_sql="SET debug_logical_replication_streaming = immediate; $CHANGES_SQL"
fi
sql >/dev/null <<SQL
INSERT INTO $SCHEMA.rows VALUES (300, 'warm');
BEGIN;
$(rows 301 310)
ROLLBACK;
SQL
capture_consume rollback "$rollback_sql"

echo "capture: wrote $seq messages to $OUT"
