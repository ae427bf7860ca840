# Sourced by the pgoutput fixture captures, scripts/capture-pgoutput-fixtures.sh
# (protocol 1) and scripts/capture-pgoutput-stream-fixtures.sh (protocol 2,
# streaming): the server checks, the slot clean-up and the writing of one file
# per message plus a MANIFEST.
#
# pg_logical_slot_get_binary_changes() returns exactly the bytes pgoutput
# writes into each XLogData payload, so no replication transport is needed.
# Each workload step is consumed from the slot right after it runs, which ties
# every message to the step that produced it (the step name is in the file name).
#
# The sourcing script sets ADMIN (a superuser URL), SCHEMA, PUB and SLOT, and
# creates $SCHEMA.wal_flush (n integer), a table left out of the publication.
# shellcheck shell=bash

for tool in psql xxd; do
    command -v "$tool" >/dev/null || { echo "capture: $tool is required" >&2; exit 1; }
done

sql() { PGOPTIONS='-c client_min_messages=warning' psql "$ADMIN" -X -q -At -v ON_ERROR_STOP=1 "$@"; }

# capture_check_server: sets `version` (server_version_num) and `major`, after
# checking the cluster is PostgreSQL 14 or later with wal_level=logical (13's
# pgoutput has neither logical decoding messages nor streaming).
capture_check_server() {
    version=$(sql -c "SHOW server_version_num")
    if [ "$version" -lt 140000 ]; then
        echo "capture: PostgreSQL 14 or later is needed; server_version_num is $version" >&2
        exit 1
    fi
    # shellcheck disable=SC2034 # for the sourcing script
    major=$((version / 10000))
    if [ "$(sql -c "SHOW wal_level")" != logical ]; then
        echo "capture: the cluster needs wal_level=logical" >&2
        exit 1
    fi
}

# capture_cleanup: drops the slot, the publication and the schema, if there.
capture_cleanup() {
    sql >/dev/null <<SQL || true
SELECT pg_drop_replication_slot('$SLOT') FROM pg_replication_slots WHERE slot_name = '$SLOT';
DROP PUBLICATION IF EXISTS $PUB;
DROP SCHEMA IF EXISTS $SCHEMA CASCADE;
SQL
}

# capture_start DIR WHAT: empties DIR and starts its MANIFEST, whose first line
# says WHAT the messages are.
capture_start() {
    OUT=$1
    rm -rf "$OUT"
    mkdir -p "$OUT"
    manifest="$OUT/MANIFEST"
    {
        echo "# $2"
        echo "# server_version_num $version; one message per file, in stream order"
        echo "# columns: file<TAB>step<TAB>lsn (as returned by pg_logical_slot_get_binary_changes)<TAB>xid"
    } >"$manifest"
    seq=0
}

# capture_consume STEP CHANGES_SQL: runs CHANGES_SQL, statements whose last one
# returns (lsn, xid, hex of data) from pg_logical_slot_get_binary_changes, and
# writes each message as <seq>_<tag>_<STEP>.bin with its MANIFEST line.
capture_consume() {
    local name=$1 changes_sql=$2 rows
    # The slot function decodes only flushed WAL, and neither a rollback nor a
    # non-transactional message flushes it. A committed write to an unpublished
    # table flushes everything before it and adds no change of its own (before
    # 15, pgoutput sends it as an empty transaction, Begin then Commit).
    sql -c "INSERT INTO $SCHEMA.wal_flush VALUES (1)"
    rows=$(sql -F $'\t' -c "$changes_sql")
    if [ -z "$rows" ]; then
        echo "# step $name: no messages" >>"$manifest"
        return
    fi
    while IFS=$'\t' read -r lsn xid hex; do
        seq=$((seq + 1))
        local tag file
        tag=$(printf '%s' "${hex:0:2}" | xxd -r -p)
        file=$(printf '%02d_%s_%s.bin' "$seq" "$tag" "$name")
        printf '%s' "$hex" | xxd -r -p >"$OUT/$file"
        printf '%s\t%s\t%s\t%s\n' "$file" "$name" "$lsn" "$xid" >>"$manifest"
    done <<<"$rows"
}
