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
#  4. runs `outbox-cdc audit --since <since> --json` under /usr/bin/time -v
#     (or, without it, polls VmHWM in /proc/<pid>/status) and, for the fixed
#     cost, once more over an empty window (--since = after the backlog).
#     The audit must report rows = BENCH_AUDIT_ROWS, missing = 0 and exit 0,
#     or the script fails;
#  5. writes bench/results/audit_rss.json: peak RSS (KiB, MiB), wall time, the
#     audit's counts, write/publish times, machine facts.
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
# also on failure or Ctrl-C. Needs psql (PostgreSQL 15 client), curl, python3
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
for tool in curl python3 "${OUTBOX_CDC_JAVA:-java}"; do
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

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
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

metrics() { curl -fsS --max-time 2 "http://127.0.0.1:$port/metrics" 2>/dev/null; }
metric() { awk -v n="$1" '$1 == n { printf "%.0f", $2; found = 1 } END { if (!found) print 0 }'; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

log "starting the connector"
"$BIN" run --config "$cfg" 2>"$run/connector.log" &
conn_pid=$!
deadline=$(( SECONDS + 120 ))
until [[ $(metrics | metric outbox_cdc_connected) == 1 ]] &&
      [[ $(psql_at "$ADMIN_URL" -c "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '$SLOT' AND active") == 1 ]]; do
  kill -0 "$conn_pid" 2>/dev/null || die "the connector exited: $(tail -5 "$run/connector.log")"
  (( SECONDS < deadline )) || die "the connector did not stream within 120 s: $(tail -5 "$run/connector.log")"
  sleep 0.2
done

since=$(sql -c "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')")
log "since $since: writing $ROWS rows ($AGGREGATES aggregates, $TX_SIZE rows a transaction)"
start_lsn=$(sql -c "SELECT pg_current_wal_insert_lsn()")
t_write=$(now)
timeout "$TIMEOUT" "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$ADMIN_DB_URL" \
  -c "SET synchronous_commit = off" \
  -c "CALL bench_fill($ROWS, $TX_SIZE, '$AGG_TYPE', $AGGREGATES)" >/dev/null ||
  die "writing the backlog failed or took over ${TIMEOUT}s"
t_written=$(now)
end_lsn=$(sql -c "SELECT pg_current_wal_insert_lsn()")
end_num=$(sql -c "SELECT pg_wal_lsn_diff('$end_lsn', '0/0')::numeric(20,0)")
wal_bytes=$(sql -c "SELECT pg_wal_lsn_diff('$end_lsn', '$start_lsn')::bigint")
[[ $(sql -c "SELECT count(*) FROM public.outbox_events") == "$ROWS" ]] || die "the table does not hold $ROWS rows"
write_s=$(elapsed "$t_write" "$t_written")
log "written in ${write_s}s; WAL $start_lsn..$end_lsn ($wal_bytes bytes)"

# --- 3. publish ---------------------------------------------------------------------
log "waiting until the connector's acked LSN >= $end_lsn"
deadline=$(( SECONDS + TIMEOUT ))
while :; do
  kill -0 "$conn_pid" 2>/dev/null || die "the connector exited: $(tail -5 "$run/connector.log")"
  (( SECONDS < deadline )) || die "the connector did not reach $end_lsn within ${TIMEOUT}s"
  if m=$(metrics) && awk -v a="$(metric outbox_cdc_acked_lsn <<<"$m")" -v e="$end_num" 'BEGIN { exit !(a >= e) }'; then
    break
  fi
  sleep 0.2
done
t_acked=$(now)
published=$(metric outbox_cdc_events_published_total <<<"$m")
gaps=$(metric outbox_cdc_sequence_gaps_total <<<"$m")
conn_rss_kib=$(awk '/^VmHWM:/ { print $2 }' "/proc/$conn_pid/status")
publish_s=$(elapsed "$t_write" "$t_acked")
log "all acknowledged ${publish_s}s after the write began ($published published, $gaps sequence gaps); stopping the connector"
kill -TERM "$conn_pid"
wait "$conn_pid" || die "the connector exited with status $? on SIGTERM: $(tail -5 "$run/connector.log")"
conn_pid=""
(( published >= ROWS )) || die "the connector published $published events, fewer than $ROWS"

# --- 4. audit -------------------------------------------------------------------------
# measure NAME ARGS...: runs `outbox-cdc audit ARGS...`; stdout to $run/NAME.json and
# "<peak RSS KiB> <wall s> <user s> <sys s> <exit status> <method>" to $run/NAME.measure.
measure() {
  local name=$1 status=0
  shift
  if [[ -x /usr/bin/time ]]; then
    timeout "$TIMEOUT" /usr/bin/time -v -o "$run/$name.time" "$BIN" audit "$@" \
      >"$run/$name.json" 2>"$run/$name.log" || status=$?
    [[ $status == 124 ]] && die "audit $name did not finish within ${TIMEOUT}s"
    cat "$run/$name.time" >>"$run/$name.log"
    awk -v st="$status" -F': ' '
      /Maximum resident set size/ { rss = $2 }
      /Elapsed \(wall clock\)/ { n = split($2, p, ":"); wall = 0; for (i = 1; i <= n; i++) wall = wall * 60 + p[i] }
      /User time/ { user = $2 } /System time/ { sys = $2 }
      END { printf "%d %.2f %.2f %.2f %d /usr/bin/time-v\n", rss, wall, user, sys, st }' \
      "$run/$name.time" >"$run/$name.measure"
  else
    # VmHWM (the kernel's peak RSS of the process) read until it exits.
    local t0 pid hwm=0 h tck
    tck=$(getconf CLK_TCK)
    t0=$(now)
    "$BIN" audit "$@" >"$run/$name.json" 2>"$run/$name.log" &
    pid=$!
    local cpu="0 0" dl=$(( SECONDS + TIMEOUT ))
    while kill -0 "$pid" 2>/dev/null; do
      (( SECONDS < dl )) || { kill -KILL "$pid"; die "audit $name did not finish within ${TIMEOUT}s"; }
      h=$(awk '/^VmHWM:/ { print $2 }' "/proc/$pid/status" 2>/dev/null) && [[ -n "$h" ]] && hwm=$h
      c=$(awk '{ print $14, $15 }' "/proc/$pid/stat" 2>/dev/null) && [[ -n "$c" ]] && cpu=$c
      sleep 0.02
    done
    wait "$pid" || status=$?
    read -r u s <<<"$cpu"
    printf '%d %s %.2f %.2f %d proc-VmHWM-poll\n' "$hwm" "$(elapsed "$t0" "$(now)")" \
      "$(awk -v c="$u" -v t="$tck" 'BEGIN { print c / t }')" "$(awk -v c="$s" -v t="$tck" 'BEGIN { print c / t }')" \
      "$status" >"$run/$name.measure"
  fi
}

log "audit --since $since (rows expected: $ROWS)"
measure audit --since "$since" --json --config "$cfg"
read -r rss_kib wall_s user_s sys_s audit_status method <"$run/audit.measure"
python3 -c 'import json, sys; json.load(open(sys.argv[1]))' "$run/audit.json" 2>/dev/null ||
  die "audit printed no JSON (exit status $audit_status): $(tail -5 "$run/audit.log")"

# The fixed cost: the same binary, config and Kafka client over a window with no rows.
empty_since=$(sql -c "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC' + interval '2 hours', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')")
measure empty --since "$empty_since" --until "$empty_since" --json --config "$cfg"
read -r empty_rss_kib empty_wall_s _ _ empty_status _ <"$run/empty.measure"

# --- 5. results ---------------------------------------------------------------------------
pg_version=$(psql_at "$ADMIN_URL" -c 'SHOW server_version')
kafka_version=$(sed -n 's|.*kafka-\([0-9][0-9.]*\).*|\1|p' <<<"${OUTBOX_CDC_KAFKA_CLASSPATH:-}")
python3 - "$run/audit.json" "$OUT/audit_rss.json" <<PY
import datetime, json, os, platform, subprocess, sys

audit = json.load(open(sys.argv[1]))
def out(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return None
def meminfo_gib():
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024 / 1024, 1)
def cpu_model():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
rss_kib = int("$rss_kib")
rss_mib = round(rss_kib / 1024, 1)
empty_kib = int("$empty_rss_kib")
rows = audit["rows"]
result = {
    "benchmark": "outbox-cdc audit peak RSS (bench/audit_rss.sh)",
    "target_mib": $TARGET_MIB,
    "within_target": rss_mib < $TARGET_MIB,
    "audit": {
        "peak_rss_kib": rss_kib,
        "peak_rss_mib": rss_mib,
        "wall_seconds": float("$wall_s"),
        "user_cpu_seconds": float("$user_s"),
        "system_cpu_seconds": float("$sys_s"),
        "exit_status": int("$audit_status"),
        "measured_with": "$method",
        "since": "$since",
        "rows": rows,
        "records": audit["records"],
        "topics": audit["topics"],
        "missing": audit["missing"],
        "phantoms": audit["phantoms"],
        "duplicates": audit["duplicates"],
        "order_violations": audit["order_violations"],
    },
    "empty_window_audit": {
        "peak_rss_kib": empty_kib,
        "peak_rss_mib": round(empty_kib / 1024, 1),
        "wall_seconds": float("$empty_wall_s"),
        "exit_status": int("$empty_status"),
    },
    "bytes_per_row_above_empty_window": round((rss_kib - empty_kib) * 1024 / rows, 1) if rows else None,
    "backlog": {
        "rows": $ROWS,
        "aggregates": $AGGREGATES,
        "rows_per_transaction": $TX_SIZE,
        "payload": "bench_payload(i): ~300-byte JSON (bench/sql/setup.sql)",
        "write_seconds": float("$write_s"),
        "wal_bytes": int("$wal_bytes"),
        "all_acked_seconds_after_write_start": float("$publish_s"),
        "connector_published": int("$published"),
        "connector_sequence_gaps": int("$gaps"),
        "connector_peak_rss_mib": round(int("$conn_rss_kib") / 1024, 1),
    },
    "machine": {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_gib": meminfo_gib(),
        "kernel": platform.release(),
        "postgresql": "$pg_version",
        "kafka": "${kafka_version:-unknown}",
        "rustc": out("rustc", "--version"),
        "git_commit": out("git", "rev-parse", "--short", "HEAD"),
        "git_dirty": bool(out("git", "status", "--porcelain", "--untracked-files=no")),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "note": "PostgreSQL and Kafka run on the same cores as the audit",
    },
    "reproduce": "scripts/env.sh up && BENCH_AUDIT_ROWS=$ROWS bench/audit_rss.sh",
}
json.dump(result, open(sys.argv[2], "w"), indent=2)
open(sys.argv[2], "a").write("\n")
PY

read -r a_rows a_records a_missing a_phantoms a_dups a_order < <(python3 -c '
import json, sys; a = json.load(open(sys.argv[1]))
print(a["rows"], a["records"], a["missing"], a["phantoms"], a["duplicates"], a["order_violations"])' "$run/audit.json")
log "audit: peak RSS $rss_kib KiB ($(awk -v k="$rss_kib" 'BEGIN { printf "%.1f", k / 1024 }') MiB), wall ${wall_s}s," \
    "rows $a_rows, records $a_records, missing $a_missing, phantoms $a_phantoms, duplicates $a_dups, order violations $a_order"
log "empty window: peak RSS $empty_rss_kib KiB; results in $OUT/audit_rss.json"
(( a_rows == ROWS )) || die "the audit counted $a_rows rows, not $ROWS"
(( a_missing == 0 )) || die "the audit found $a_missing missing rows"
(( audit_status == 0 )) || die "the audit exited with status $audit_status: $(tail -5 "$run/audit.log")"
if awk -v k="$rss_kib" -v t="$TARGET_MIB" 'BEGIN { exit !(k / 1024 >= t) }'; then
  log "peak RSS is above the ${TARGET_MIB} MiB target"
  [[ "${BENCH_AUDIT_ENFORCE:-0}" == 1 ]] && exit 3
fi
exit 0
