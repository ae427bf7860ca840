#!/usr/bin/env bash
# Peak memory of `outbox-cdc audit` over a large window (target: under 64 MiB
# for 1,000,000 rows). On the test environment (scripts/env.sh up; it is never
# stopped here):
#
#  1. builds the release binary;
#  2. makes a database of its own (migrations/*.sql, bench/sql/setup.sql) and
#     starts the connector (release build, [topics] create = true) on it; once
#     the connector has made its slot and streams, records `since` (server
#     clock) and writes BENCH_AUDIT_ROWS outbox rows by server-side SQL
#     (bench_fill: one writer, transactions of BENCH_AUDIT_TX_SIZE rows,
#     BENCH_AUDIT_AGGREGATES aggregates with consecutive aggregate_sequence);
#  3. waits until the connector's acked LSN (/metrics) reaches the backlog's
#     end LSN, then stops it (SIGTERM);
#  4. runs `outbox-cdc audit --since <since> --json` to its end, its peak RSS
#     taken from wait4's rusage (ru_maxrss, what /usr/bin/time -v reports;
#     VmHWM polled beside it), and, for the fixed cost, once more over an
#     empty window (--since = after the backlog).
#     The audit must report rows = BENCH_AUDIT_ROWS, missing = 0 and exit 0,
#     or the script fails;
#  5. writes bench/results/audit_rss.json: peak RSS (KiB, MiB), wall time, the
#     audit's counts, write/publish times, machine facts and versions.
#
# This script starts and stops processes; every figure is taken by
# bench/tools/bench.py (wait-metric, backlog, wait-lsn, run-measured,
# audit-report).
#
# Usage:
#   OUTBOX_CDC_PG_PORT=54341 OUTBOX_CDC_KAFKA_PORT=19192 OUTBOX_CDC_KAFKA_CONTROLLER_PORT=19193 \
#     scripts/env.sh up                       # or plain `scripts/env.sh up`
#   bench/audit_rss.sh                        # 1,000,000 rows (~80 s on 2 cores, plus the build)
#   BENCH_AUDIT_ROWS=100000 bench/audit_rss.sh   # quicker
#
# Settings (environment):
#   BENCH_AUDIT_ROWS=1000000       rows in the audited window
#   BENCH_AUDIT_AGGREGATES=10000   distinct aggregate ids
#   BENCH_AUDIT_TX_SIZE=100        rows per transaction of the backlog
#   BENCH_AUDIT_TIMEOUT=1800       seconds allowed for each phase (write, publish, audit)
#   BENCH_AUDIT_TARGET_MIB=64      the target; BENCH_AUDIT_ENFORCE=1 exits 3 above it
#   BENCH_NO_BUILD=1               use target/release/outbox-cdc as it is
#   BENCH_OUT=bench/results        where audit_rss.json goes
#   BENCH_KEEP_RUN_DIR=0           1 keeps target/bench/audit-<id>/ (config, logs, audit JSON)
#   OUTBOX_CDC__*                  reach the connector and the audit as usual
#
# Idempotent: everything a run creates has a unique name (database, slot and
# topic prefix auditbench_<id> / auditbench.<id>.*) and is dropped at the end,
# also on failure or Ctrl-C. Needs psql (PostgreSQL 15 client), python3
# (standard library only) and java (the test environment's Kafka tools).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

ROWS=${BENCH_AUDIT_ROWS:-1000000}
AGGREGATES=${BENCH_AUDIT_AGGREGATES:-10000}
TX_SIZE=${BENCH_AUDIT_TX_SIZE:-100}
TIMEOUT=${BENCH_AUDIT_TIMEOUT:-1800}
TARGET_MIB=${BENCH_AUDIT_TARGET_MIB:-64}
OUT=${BENCH_OUT:-bench/results}

log() { printf 'audit_rss: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

for v in ROWS AGGREGATES TX_SIZE TIMEOUT TARGET_MIB; do
  [[ ${!v} =~ ^[0-9]+$ && ${!v} -gt 0 ]] || die "BENCH_AUDIT_$v must be a positive integer (is '${!v}')"
done
[[ -f target/env/test.env ]] || die "target/env/test.env is missing: run scripts/env.sh up first"
# shellcheck disable=SC1091
. target/env/test.env
PG_BIN=${OUTBOX_CDC_PG_BIN:-/usr/lib/postgresql/15/bin}
[[ -x "$PG_BIN/psql" ]] || die "$PG_BIN/psql not found (PostgreSQL 15 client binaries)"
for tool in python3 "${OUTBOX_CDC_JAVA:-java}"; do
  command -v "$tool" >/dev/null || die "$tool not found"
done

id="$(date +%Y%m%d%H%M%S)_$$"
DB="auditbench_$id"
SLOT="auditbench_$id"
TOPIC_PREFIX="auditbench.$id"
AGG_TYPE=orders
TOPIC="$TOPIC_PREFIX.$AGG_TYPE"
run="$root/target/bench/audit-$id"
mkdir -p "$run" "$OUT"

# The benchmark's database on the same server, with the same roles.
with_db() { local base=${1%%\?*}; printf '%s/%s%s' "${base%/*}" "$DB" "${1#"$base"}"; }
ADMIN_URL=$OUTBOX_CDC_TEST_PG_ADMIN
ADMIN_DB_URL=$(with_db "$OUTBOX_CDC_TEST_PG_ADMIN")
DB_URL=$(with_db "$OUTBOX_CDC_TEST_PG")
psql_at() { "$PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"; }
sql() { psql_at "$ADMIN_DB_URL" "$@"; }
export BENCH_PSQL="$PG_BIN/psql"
bench() { python3 bench/tools/bench.py "$@"; }

kafka_topics() {
  timeout 120 "${OUTBOX_CDC_JAVA:-java}" -Xmx128m -cp "$OUTBOX_CDC_KAFKA_CLASSPATH" \
    -Dlog4j2.configurationFile="$OUTBOX_CDC_ENV_DIR/kafka/log4j2-tools.properties" \
    org.apache.kafka.tools.TopicCommand --bootstrap-server "$OUTBOX_CDC_TEST_KAFKA" "$@"
}

conn_pid=""
created_db=0
cleanup() {
  local status=$?
  trap - INT TERM EXIT
  set +e
  if [[ -n "$conn_pid" ]]; then kill -TERM "$conn_pid" 2>/dev/null; wait "$conn_pid" 2>/dev/null; fi
  if (( created_db )); then
    # A logical slot pins WAL for the whole cluster and blocks DROP DATABASE.
    for _ in $(seq 1 50); do
      psql_at "$ADMIN_URL" -c "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
                                WHERE slot_name = '$SLOT' AND active_pid IS NOT NULL" >/dev/null
      [[ $(psql_at "$ADMIN_URL" -c "SELECT count(pg_drop_replication_slot(slot_name)) FILTER (WHERE NOT active), count(*)
                                      FROM pg_replication_slots WHERE slot_name = '$SLOT'" | cut -d'|' -f2) == 0 ]] && break
      sleep 0.2
    done
    psql_at "$ADMIN_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null && log "dropped database $DB and slot $SLOT"
    kafka_topics --delete --if-exists --topic "$TOPIC" >/dev/null 2>&1 && log "deleted topic $TOPIC"
  fi
  if [[ "${BENCH_KEEP_RUN_DIR:-0}" != 1 && $status -eq 0 ]]; then rm -rf "$run"; else log "run files kept in $run"; fi
  exit "$status"
}
trap cleanup INT TERM EXIT

# --- 1. build -------------------------------------------------------------------
BIN="$root/target/release/outbox-cdc"
if [[ "${BENCH_NO_BUILD:-0}" != 1 ]]; then
  log "building the connector (release)"
  cargo build --release --quiet --bin outbox-cdc
fi
[[ -x "$BIN" ]] || die "$BIN not found (cargo build --release)"

# --- 2. database, connector, backlog -----------------------------------------------
psql_at "$ADMIN_URL" -c 'SELECT 1' >/dev/null || die "PostgreSQL is not reachable: scripts/env.sh status"
log "run $id: database $DB, slot $SLOT, topic $TOPIC, files $run"
psql_at "$ADMIN_URL" -c "CREATE DATABASE $DB" >/dev/null
created_db=1
for f in migrations/*.sql bench/sql/setup.sql; do sql -f "$f" >/dev/null; done
sql -c "GRANT SELECT ON public.outbox_events TO outbox" >/dev/null

port=$(bench free-port)
cfg="$run/config.toml"
cat >"$cfg" <<TOML
# bench/audit_rss.sh run $id
[postgres]
url = "$DB_URL"
slot = "$SLOT"
publication = "outbox_pub"
create_slot = true

[outbox]
table = "public.outbox_events"
topic = "$TOPIC_PREFIX.{aggregate_type}"

[kafka]
"bootstrap.servers" = "$OUTBOX_CDC_TEST_KAFKA"
"linger.ms" = "5"

# The test broker does not auto-create topics.
[topics]
create = true
partitions = 3
replication_factor = 1

[offsets]
path = "$run/offsets"

[http]
listen = "127.0.0.1:$port"
TOML

metrics_url="http://127.0.0.1:$port/metrics"

log "starting the connector"
"$BIN" run --config "$cfg" 2>"$run/connector.log" &
conn_pid=$!
bench wait-metric --pid "$conn_pid" --metrics "$metrics_url" --name outbox_cdc_connected --at-least 1 \
  --timeout 120 --slot "$SLOT" --db-url "$ADMIN_URL" --log "$run/connector.log" ||
  die "the connector did not stream within 120 s"

since=$(sql -c "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
log "since $since: writing $ROWS rows ($AGGREGATES aggregates, $TX_SIZE rows a transaction)"
start_lsn=$(sql -c "SELECT pg_current_wal_insert_lsn()")
started=$EPOCHREALTIME
timeout "$TIMEOUT" "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$ADMIN_DB_URL" \
  -c "SET synchronous_commit = off" \
  -c "CALL bench_fill($ROWS, $TX_SIZE, '$AGG_TYPE', $AGGREGATES)" >/dev/null ||
  die "writing the backlog failed or took over ${TIMEOUT}s"
ended=$EPOCHREALTIME
end_lsn=$(sql -c "SELECT pg_current_wal_insert_lsn()")
bench backlog --db-url "$ADMIN_DB_URL" --start-lsn "$start_lsn" --end-lsn "$end_lsn" --started "$started" \
  --ended "$ended" --events "$ROWS" --tx "$TX_SIZE" --label backlog --out "$run/backlog.json" || die "the backlog"

# --- 3. publish ---------------------------------------------------------------------
log "waiting until the connector's acked LSN >= $end_lsn"
bench wait-lsn --pid "$conn_pid" --metrics "$metrics_url" --end-lsn "$end_lsn" --events "$ROWS" \
  --started "$started" --timeout "$TIMEOUT" --slot "$SLOT" --db-url "$ADMIN_URL" --no-threads \
  --expect-published "$ROWS" --log "$run/connector.log" --label "publish (from the write's start)" \
  --out "$run/publish.json" || die "publishing the backlog"
log "stopping the connector"
kill -TERM "$conn_pid"
wait "$conn_pid" || die "the connector exited with status $? on SIGTERM: $(tail -5 "$run/connector.log")"
conn_pid=""

# --- 4. audit -------------------------------------------------------------------------
# measure NAME ARGS...: runs `outbox-cdc audit ARGS...` to its end; stdout to
# $run/NAME.json, its figures to $run/NAME.measure.json.
measure() {
  local name=$1
  shift
  bench run-measured --timeout "$TIMEOUT" --stdout "$run/$name.json" --stderr "$run/$name.log" \
    --out "$run/$name.measure.json" -- "$BIN" audit "$@" || die "audit $name"
}

log "audit --since $since (rows expected: $ROWS)"
measure audit --since "$since" --json --config "$cfg"

# The fixed cost: the same binary, config and Kafka client over a window with no rows.
empty_since=$(sql -c "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC' + interval '2 hours', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')")
measure empty --since "$empty_since" --until "$empty_since" --json --config "$cfg"

# --- 5. results ---------------------------------------------------------------------------
enforce=()
if [[ "${BENCH_AUDIT_ENFORCE:-0}" == 1 ]]; then enforce=(--enforce); fi
# Exits 1 when the audit is wrong, 3 above the target under BENCH_AUDIT_ENFORCE=1.
bench audit-report --audit-json "$run/audit.json" --audit-log "$run/audit.log" --measure "$run/audit.measure.json" \
  --empty-measure "$run/empty.measure.json" --backlog "$run/backlog.json" --connector "$run/publish.json" \
  --since "$since" --rows "$ROWS" --aggregates "$AGGREGATES" --tx-size "$TX_SIZE" --target "$TARGET_MIB" \
  --admin-url "$ADMIN_URL" --kafka-classpath "${OUTBOX_CDC_KAFKA_CLASSPATH:-}" --pg-bin "$PG_BIN" \
  --java "${OUTBOX_CDC_JAVA:-java}" --out "$OUT/audit_rss.json" "${enforce[@]}"
