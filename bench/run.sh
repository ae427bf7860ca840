#!/usr/bin/env bash
# outbox-cdc benchmark (DESIGN.md §10). Measures, on the test environment
# (scripts/env.sh up; it is never stopped here):
#
#  1. Catch-up. With the connector stopped, two logical slots are created on one
#     publication, then a backlog of BENCH_EVENTS outbox rows (~300-byte JSON
#     payloads, BENCH_AGGREGATES aggregates) is written by server-side SQL, once
#     per transaction size in BENCH_TX_SIZES. Then, one after the other:
#       (a) pg_recvlogical (pgoutput, proto_version 1) drains one slot to
#           /dev/null up to the backlog's end LSN: the physical limit of
#           server-side decoding on this machine;
#       (b) outbox-cdc (release build) drains the other slot into Kafka
#           (acks=all) until its acked LSN (/metrics outbox_cdc_acked_lsn,
#           which is persisted and reported to PostgreSQL) reaches the end LSN;
#           once per connector variant (BENCH_VARIANTS; by default both
#           delivery modes, at-least-once and exactly-once), each from a slot
#           of its own. In exactly-once mode the acked LSN moves only after
#           each Kafka commit, so the figure includes the last commit.
#     Reported: events/s of both (from process start), their ratio, the
#     connector's peak RSS (VmHWM).
#  2. Steady state, once per variant (BENCH_STEADY_VARIANTS), each with its
#     own slot and topic and the same pgbench settings. pgbench
#     (bench/steady.pgbench: an order row plus its outbox row through
#     outbox_emit() per transaction) runs BENCH_CLIENTS clients for
#     BENCH_STEADY_SECONDS at full speed (or BENCH_RATE tps) while the
#     connector runs. Latency = Kafka consume time minus record timestamp (the
#     commit time) for every record, read by a consumer started before the
#     load with isolation.level=read_committed (for exactly-once, records are
#     visible only once their Kafka transaction commits; for at-least-once it
#     makes no difference); the connector's own commit-to-ack histogram is
#     reported beside it. Slot lag (pg_current_wal_lsn - confirmed_flush_lsn)
#     is sampled every 200 ms.
#
# Output: bench/results/latest.json, bench/results/latest.png (BENCH_OUT sets
# the directory); intermediate files and logs in target/bench/run-<id>/.
#
# Usage:
#   scripts/env.sh up && bench/run.sh                 # full run (1,000,000 events)
#   BENCH_EVENTS=200000 BENCH_STEADY_SECONDS=30 bench/run.sh   # quicker
#   BENCH_PHASES=drain bench/run.sh                   # only the catch-up
#   BENCH_VARIANTS=at-least-once bench/run.sh         # one delivery mode only
#
# Settings (environment):
#   BENCH_EVENTS=1000000      backlog size per transaction size
#   BENCH_TX_SIZES="1 100"    events per transaction of the backlogs
#   BENCH_AGGREGATES=10000    distinct aggregate ids
#   BENCH_WRITERS=2           parallel sessions writing a backlog
#   BENCH_PARTITIONS=3        partitions of each benchmark topic
#   BENCH_PHASES="drain steady"
#   BENCH_STEADY_SECONDS=60  BENCH_CLIENTS=4  BENCH_THREADS=2  BENCH_RATE=(unset: max)
#   BENCH_DRAIN_TIMEOUT=1800  seconds allowed for one drain
#   BENCH_NO_BUILD=1          use target/release/outbox-cdc as it is
#   BENCH_OUT=bench/results   where latest.json / latest.png go
#   BENCH_PERF=1              record a perf profile (cpu-clock, DWARF stacks) of the
#                             connector during each drain into the run dir
#   BENCH_PEER=               "debezium": after the connector's drains, Debezium 3.6.1
#                             (Kafka Connect 4.1.1 standalone, PostgreSQL connector,
#                             Outbox Event Router routed like ours, StringConverter)
#                             drains the same backlog from its own slot; its events/s,
#                             CPU seconds and peak RSS go to latest.json as peer.*.
#                             Jars from Maven Central (bench/debezium/pom.xml, mvn)
#   BENCH_FLOOR=1             after the connector's drains, the producer alone
#                             (examples/produce_floor.rs) sends as many records shaped
#                             like the backlog's through the connector's KafkaSink;
#                             its CPU seconds go to latest.json as producer_floor[]
#   BENCH_KEEP_RUN_DIR=0      1 keeps target/bench/run-<id>/ (latency samples, logs)
#   BENCH_VARIANTS="at-least-once exactly-once:OUTBOX_CDC__DELIVERY__MODE=exactly-once"
#                             connector variants draining the same backlogs, each
#                             from its own slot: "name[:KEY=VALUE,...]" separated by
#                             spaces, KEY = an OUTBOX_CDC__* override, BIN (another
#                             binary) or CONFIG (another config file, e.g. the example
#                             config of an older commit for its binary), e.g. "default linger50:OUTBOX_CDC__KAFKA__LINGER_MS=50";
#                             the first is the headline (drain.*, steady); the others
#                             go to drain.variants and steady_variants; `;` in a VALUE
#                             stands for `,` (a list: OUTBOX_CDC__OUTBOX__HEADERS=event_id;event_type)
#   BENCH_STEADY_VARIANTS=all "all": the steady phase runs once per variant, one after
#                             the other (steady = the first's result, steady_variants =
#                             every one's); "first": only the first variant's
#   OUTBOX_CDC__*             passed through to the connector (e.g.
#                             OUTBOX_CDC__KAFKA__LINGER_MS=10); the benchmark sets
#                             only the URL, slot, topic, offsets path and http.listen,
#                             and for an exactly-once variant (OUTBOX_CDC__DELIVERY__MODE=
#                             exactly-once) delivery.offsets_topic = bench.<id>.offsets
#                             unless the variant or the environment names one (so the
#                             run's markers are dropped with its other topics).
#
# Everything the run creates has a unique name (database bench_<id>, slots
# bench_<id>_*, topics bench.<id>.*) and is dropped at the end, also on failure
# or Ctrl-C. Needs: psql, pgbench, pg_recvlogical (PostgreSQL 15 client
# binaries), curl, python3 (a venv with confluent-kafka and matplotlib is made
# under target/bench/venv on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

EVENTS=${BENCH_EVENTS:-1000000}
TX_SIZES=${BENCH_TX_SIZES:-"1 100"}
AGGREGATES=${BENCH_AGGREGATES:-10000}
WRITERS=${BENCH_WRITERS:-2}
PARTITIONS=${BENCH_PARTITIONS:-3}
PHASES=${BENCH_PHASES:-"drain steady"}
STEADY_SECONDS=${BENCH_STEADY_SECONDS:-60}
CLIENTS=${BENCH_CLIENTS:-4}
THREADS=${BENCH_THREADS:-2}
RATE=${BENCH_RATE:-}
DRAIN_TIMEOUT=${BENCH_DRAIN_TIMEOUT:-1800}
PEER=${BENCH_PEER:-}
FLOOR=${BENCH_FLOOR:-1}
[[ $FLOOR == 0 || $FLOOR == 1 ]] || { echo "bench: BENCH_FLOOR=$FLOOR: 0 or 1" >&2; exit 2; }
[[ -z $PEER || $PEER == debezium ]] || { echo "bench: BENCH_PEER=$PEER: only debezium is known" >&2; exit 2; }
VARIANTS=${BENCH_VARIANTS:-"at-least-once exactly-once:OUTBOX_CDC__DELIVERY__MODE=exactly-once"}
STEADY_VARIANTS=${BENCH_STEADY_VARIANTS:-all}
[[ $STEADY_VARIANTS == all || $STEADY_VARIANTS == first ]] ||
  { echo "bench: BENCH_STEADY_VARIANTS=$STEADY_VARIANTS: all or first" >&2; exit 2; }
OUT=${BENCH_OUT:-bench/results}
PG_BIN=${OUTBOX_CDC_PG_BIN:-/usr/lib/postgresql/15/bin}

log() { printf 'bench: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[[ -f target/env/test.env ]] || die "target/env/test.env is missing: run scripts/env.sh up first"
# shellcheck disable=SC1091
. target/env/test.env
PG_BIN=${OUTBOX_CDC_PG_BIN:-$PG_BIN}
for tool in psql pgbench pg_recvlogical; do
  [[ -x "$PG_BIN/$tool" ]] || die "$PG_BIN/$tool not found (PostgreSQL 15 client binaries)"
done
command -v curl >/dev/null || die "curl not found"
[[ "$EVENTS" =~ ^[0-9]+$ && "$EVENTS" -gt 0 ]] || die "BENCH_EVENTS must be a positive integer"

id="$(date +%Y%m%d%H%M%S)_$$"
DB="bench_$id"
run="$root/target/bench/run-$id"
mkdir -p "$run" "$OUT"
topic_prefix="bench.$id"

# URLs for the benchmark's database: same server and roles, other dbname.
with_db() {
  local url=$1 base query
  base=${url%%\?*}
  query=${url#"$base"}
  printf '%s/%s%s' "${base%/*}" "$DB" "$query"
}
ADMIN_URL=$OUTBOX_CDC_TEST_PG_ADMIN
ADMIN_DB_URL=$(with_db "$OUTBOX_CDC_TEST_PG_ADMIN")
DB_URL=$(with_db "$OUTBOX_CDC_TEST_PG")

sql() { "$PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 "$ADMIN_DB_URL" "$@"; }

pids=()
created_db=0
topics=()
cleanup() {
  local status=$?
  trap - INT TERM EXIT
  set +e
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  if (( created_db )); then
    # Slots pin WAL for the whole cluster: never leave ours behind.
    "$PG_BIN/psql" -X -q -At "$ADMIN_URL" -c "
      SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
       WHERE slot_name LIKE 'bench\_${id}\_%' AND active_pid IS NOT NULL" >/dev/null
    for _ in $(seq 1 50); do
      left=$("$PG_BIN/psql" -X -q -At "$ADMIN_URL" -c "
        SELECT count(pg_drop_replication_slot(slot_name)) FILTER (WHERE NOT active), count(*)
          FROM pg_replication_slots WHERE slot_name LIKE 'bench\_${id}\_%'" | cut -d'|' -f2)
      [[ "$left" == 0 ]] && break
      sleep 0.2
    done
    "$PG_BIN/psql" -X -q -At "$ADMIN_URL" -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null \
      && log "dropped database $DB and its slots"
  fi
  if (( ${#topics[@]} )); then
    "$PY" bench/tools/bench.py topics-delete "$OUTBOX_CDC_TEST_KAFKA" "${topics[@]}" >&2
  fi
  if [[ "${BENCH_KEEP_RUN_DIR:-0}" != 1 && $status -eq 0 ]]; then
    rm -rf "$run"
  else
    log "run files kept in $run"
  fi
  exit "$status"
}
trap cleanup INT TERM EXIT

# --- tools -------------------------------------------------------------------
venv="$root/target/bench/venv"
PY="$venv/bin/python"
if ! "$PY" -c 'import confluent_kafka, matplotlib' 2>/dev/null; then
  log "installing confluent-kafka and matplotlib into $venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q confluent-kafka matplotlib
fi

BIN="$root/target/release/outbox-cdc"
if [[ "${BENCH_NO_BUILD:-0}" != 1 ]]; then
  log "building the connector (release)"
  cargo build --release --quiet --bin outbox-cdc --example produce_floor
fi
[[ -x "$BIN" ]] || die "$BIN not found (cargo build --release)"
FLOOR_BIN="$root/target/release/examples/produce_floor"
[[ $FLOOR == 0 || -x "$FLOOR_BIN" ]] || die "$FLOOR_BIN not found (cargo build --release --example produce_floor)"

free_port() {
  "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# --- machine -----------------------------------------------------------------
"$PG_BIN/psql" -X -q -At "$ADMIN_URL" -c 'SELECT 1' >/dev/null || die "PostgreSQL is not reachable: scripts/env.sh status"
pg_version=$("$PG_BIN/psql" -X -q -At "$ADMIN_URL" -c 'SHOW server_version')
kafka_version=$(sed -n 's|.*kafka-\([0-9][0-9.]*\).*|\1|p' <<<"${OUTBOX_CDC_KAFKA_CLASSPATH:-}")
"$PY" - "$run/machine.json" "$pg_version" "${kafka_version:-unknown}" <<'PY'
import json, os, platform, subprocess, sys, datetime
def first(path, key):
    with open(path) as f:
        for line in f:
            if line.startswith(key):
                return line.split(":", 1)[1].strip()
mem_kib = int(first("/proc/meminfo", "MemTotal").split()[0])
def out(*cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return None
json.dump({
    "nproc": os.cpu_count(),
    "cpu_model": first("/proc/cpuinfo", "model name"),
    "memory_gib": round(mem_kib / 1024 / 1024, 1),
    "kernel": platform.release(),
    "postgresql": sys.argv[2],
    "kafka": sys.argv[3],
    "rustc": out("rustc", "--version"),
    "git_commit": out("git", "rev-parse", "--short", "HEAD"),
    "loadavg_at_start": open("/proc/loadavg").read().split()[:3],
    "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "note": "PostgreSQL, Kafka, the connector, pgbench and the consumer share these cores",
}, open(sys.argv[1], "w"), indent=2)
PY
env | grep '^OUTBOX_CDC__' | sed 's|://[^@]*@|://***@|' | sort >"$run/connector_env_overrides.txt" || true
"$PY" - "$run/config.json" "$run/connector_env_overrides.txt" "$VARIANTS" "$STEADY_VARIANTS" <<PY
import json, sys
overrides = dict(l.rstrip("\n").split("=", 1) for l in open(sys.argv[2]) if "=" in l)
json.dump({
    "events": $EVENTS, "tx_sizes": [int(x) for x in "$TX_SIZES".split()],
    "aggregates": $AGGREGATES, "partitions": $PARTITIONS, "backlog_writers": $WRITERS,
    "steady_seconds": $STEADY_SECONDS, "clients": $CLIENTS, "threads": $THREADS,
    "rate": "${RATE:-max}", "connector_config": "config/example.toml",
    "connector_env_overrides": overrides,
    "variants": sys.argv[3].split(), "steady_variants": sys.argv[4],
}, open(sys.argv[1], "w"), indent=2)
PY

# --- database and topics -------------------------------------------------------
log "run $id: database $DB, topics $topic_prefix.*, files $run"
"$PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 "$ADMIN_URL" -c "CREATE DATABASE $DB" >/dev/null
created_db=1
for f in migrations/*.sql bench/sql/setup.sql; do sql -f "$f" >/dev/null; done
sql -c "GRANT SELECT ON public.outbox_events TO outbox" >/dev/null

lsn_num() { sql -c "SELECT pg_wal_lsn_diff('$1', '0/0')::numeric(20,0)"; }

create_slot() { sql -c "SELECT lsn FROM pg_create_logical_replication_slot('$1', 'pgoutput')" >/dev/null; }
drop_slot() {
  local slot=$1
  for _ in $(seq 1 50); do
    sql -c "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
             WHERE slot_name = '$slot' AND active_pid IS NOT NULL" >/dev/null
    if [[ $(sql -c "SELECT count(pg_drop_replication_slot(slot_name)) FILTER (WHERE NOT active), count(*)
                      FROM pg_replication_slots WHERE slot_name = '$slot'" | cut -d'|' -f2) == 0 ]]; then
      return 0
    fi
    sleep 0.2
  done
  log "warning: slot $slot still exists; dropped at cleanup"
}

now() { date +%s.%N; }
tck=$(getconf CLK_TCK)
# CPU seconds (user + system, all threads) a process has used so far; 0 when gone.
cpu_secs() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  awk -v t="$tck" '{ printf "%.2f", ($12 + $13) / t }' <<<"${stat##*) }"
}
# Per-thread CPU seconds and context switches of a process, as JSON members.
thread_stats() {
  local pid=$1 t name stat ctx
  local -A cpu=() sw=()
  for t in /proc/"$pid"/task/*; do
    name=$(cat "$t/comm" 2>/dev/null) || continue
    name=${name//[^A-Za-z0-9:_-]/_}
    name=${name%%[0-9]*}  # rdk:broker1 / sled-io-3 → one bucket per kind
    stat=$(cat "$t/stat" 2>/dev/null) || continue
    ctx=$(awk '/ctxt_switches/ { n += $2 } END { print n + 0 }' "$t/status" 2>/dev/null)
    stat=${stat##*) }
    read -r -a f <<<"$stat"
    cpu[$name]=$(( ${cpu[$name]:-0} + f[11] + f[12] ))
    sw[$name]=$(( ${sw[$name]:-0} + ctx ))
  done
  local first=1
  printf '{'
  for name in "${!cpu[@]}"; do
    (( first )) || printf ', '
    first=0
    printf '"%s": {"cpu_s": %s, "context_switches": %s}' "$name" \
      "$(awk -v c="${cpu[$name]}" -v t="$tck" 'BEGIN { printf "%.2f", c / t }')" "${sw[$name]}"
  done
  printf '}'
}
kafka_pid() { cat "${OUTBOX_CDC_ENV_DIR:-target/env}/kafka.pid" 2>/dev/null || echo 0; }
slot_pid() { sql -c "SELECT coalesce(active_pid, 0) FROM pg_replication_slots WHERE slot_name = '$1'"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
rate() { awk -v n="$1" -v s="$2" 'BEGIN { printf "%.0f", n / s }'; }

conn_env=()
conn_bin=$BIN
conn_config=config/example.toml
perf_pid=0
# Starts the connector in the background; sets conn_pid and conn_port, and
# perf_pid when BENCH_PERF is set and this is a drain (perf runs the connector
# as its child, so threads created later, e.g. librdkafka's, are sampled too).
start_connector() {
  local slot=$1 name=$2 topic_template=${3:-"$topic_prefix.{aggregate_type}"}
  local wrapper=()
  conn_port=$(free_port)
  rm -rf "$run/offsets-$name"
  perf_pid=0
  if [[ -n "${BENCH_PERF:-}" && $name == drain* ]]; then
    # Software clock: works without access to hardware counters.
    wrapper=(perf record -q -e cpu-clock -F "${BENCH_PERF_FREQ:-499}" --call-graph "dwarf,32768"
             -o "$run/perf-$name.data" --)
  fi
  OUTBOX_CDC__POSTGRES__URL="$DB_URL" \
  OUTBOX_CDC__POSTGRES__SLOT="$slot" \
  OUTBOX_CDC__POSTGRES__PUBLICATION=outbox_pub \
  OUTBOX_CDC__POSTGRES__CREATE_SLOT=false \
  OUTBOX_CDC__POSTGRES__CREATE_PUBLICATION=false \
  OUTBOX_CDC__OUTBOX__TOPIC="$topic_template" \
  OUTBOX_CDC__KAFKA__BOOTSTRAP_SERVERS="$OUTBOX_CDC_TEST_KAFKA" \
  OUTBOX_CDC__OFFSETS__PATH="$run/offsets-$name" \
  OUTBOX_CDC__HTTP__LISTEN="127.0.0.1:$conn_port" \
    "${wrapper[@]}" env "${conn_env[@]}" "$conn_bin" run --config "$conn_config" 2>"$run/connector-$name.log" &
  conn_pid=$!
  pids+=("$conn_pid")
  if (( ${#wrapper[@]} )); then
    perf_pid=$conn_pid
    conn_pid=""
    for _ in $(seq 1 100); do
      conn_pid=$(pgrep -P "$perf_pid" || true)
      [[ -n "$conn_pid" ]] && break
      sleep 0.05
    done
    [[ -n "$conn_pid" ]] || die "the connector did not start under perf: $(tail -3 "$run/connector-$name.log")"
    pids+=("$conn_pid")
  fi
}

metric() { # metric NAME < metrics text
  awk -v n="$1" '$1 == n { printf "%.0f", $2; found = 1 } END { if (!found) print 0 }'
}

peak_rss_mib() {
  awk '/^VmHWM:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo 0
}

stop_pid() {
  local pid=$1
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 300); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
    sleep 0.1
  done
  log "warning: process $pid did not stop within 30 s; killing it"
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

# --- connector variants ------------------------------------------------------------
# Variants: "name[:KEY=VALUE[,KEY=VALUE...]]" separated by spaces; KEY is an
# OUTBOX_CDC__* override, BIN (another connector binary) or CONFIG (another
# config file). Each variant drains the same backlog from a slot of its own
# and runs its own steady phase; the first is the headline.
read -r -a variants <<<"$VARIANTS"
(( ${#variants[@]} )) || die "BENCH_VARIANTS is empty"
offsets_topic="$topic_prefix.offsets"
# Sets conn_env, conn_bin, conn_config and variant_name for variants[$1].
use_variant() {
  local v=${variants[$1]} kv kvs
  variant_name=${v%%:*}
  conn_env=()
  conn_bin=$BIN
  conn_config=config/example.toml
  if [[ $v == *:* ]]; then
    IFS=, read -r -a kvs <<<"${v#*:}"
    for kv in "${kvs[@]}"; do
      kv=${kv//;/,}  # `;` in a value stands for `,` (list values)
      case $kv in
        BIN=*) conn_bin=${kv#BIN=} ;;
        CONFIG=*) conn_config=${kv#CONFIG=} ;;
        OUTBOX_CDC__*=*) conn_env+=("$kv") ;;
        *) die "variant $v: $kv is neither BIN=..., CONFIG=... nor OUTBOX_CDC__...=..." ;;
      esac
    done
  fi
  # Exactly-once markers go to a topic of the run's (dropped at the end)
  # instead of the shared default, unless one is named.
  local mode=${OUTBOX_CDC__DELIVERY__MODE:-} named=${OUTBOX_CDC__DELIVERY__OFFSETS_TOPIC:-}
  for kv in "${conn_env[@]}"; do
    case $kv in
      OUTBOX_CDC__DELIVERY__MODE=*) mode=${kv#*=} ;;
      OUTBOX_CDC__DELIVERY__OFFSETS_TOPIC=*) named=${kv#*=} ;;
    esac
  done
  if [[ $mode == exactly-once && -z $named ]]; then
    conn_env+=("OUTBOX_CDC__DELIVERY__OFFSETS_TOPIC=$offsets_topic")
    [[ " ${topics[*]} " == *" $offsets_topic "* ]] || topics+=("$offsets_topic")
  fi
}
for k in "${!variants[@]}"; do use_variant "$k"; done  # refuse a malformed list before the first backlog

# --- 1. catch-up ---------------------------------------------------------------
drain() {
  local tx=$1
  local agg_type="drain$tx" rl_slot="bench_${id}_rl$tx" topic="$topic_prefix.drain$tx"
  local v k
  "$PY" bench/tools/bench.py topics-create "$OUTBOX_CDC_TEST_KAFKA" "$PARTITIONS" "$topic" >&2
  topics+=("$topic")
  sql -c "TRUNCATE public.outbox_events, public.outbox_aggregate_sequences" >/dev/null
  # Every slot exists before the backlog is written, so each sees all of it.
  create_slot "$rl_slot"
  for k in "${!variants[@]}"; do create_slot "bench_${id}_cdc${tx}_$k"; done
  if [[ -n $PEER ]]; then create_slot "bench_${id}_dbz$tx"; fi

  log "drain tx=$tx: writing $EVENTS events in transactions of $tx"
  local start_lsn end_lsn end_num t0 t1
  start_lsn=$(sql -c "SELECT pg_current_wal_insert_lsn()")
  t0=$(now)
  local writers=() w
  for (( w = 0; w < WRITERS; w++ )); do
    sql -c "SET synchronous_commit = off" \
        -c "CALL bench_fill($EVENTS, $tx, '$agg_type', $AGGREGATES, $w, $WRITERS)" &
    writers+=($!)
  done
  for w in "${writers[@]}"; do wait "$w" || die "writing the backlog failed"; done
  [[ $(sql -c "SELECT count(*) FROM public.outbox_events") == "$EVENTS" ]] || die "the backlog is not $EVENTS rows"
  t1=$(now)
  end_lsn=$(sql -c "SELECT pg_current_wal_insert_lsn()")
  end_num=$(lsn_num "$end_lsn")
  local write_s wal_bytes
  write_s=$(elapsed "$t0" "$t1")
  wal_bytes=$(sql -c "SELECT pg_wal_lsn_diff('$end_lsn', '$start_lsn')::bigint")
  log "drain tx=$tx: backlog written in ${write_s}s ($(rate "$EVENTS" "$write_s") events/s), WAL $start_lsn..$end_lsn ($wal_bytes bytes)"

  # (a) pg_recvlogical
  log "drain tx=$tx: pg_recvlogical → /dev/null up to $end_lsn"
  local wpid=0 wcpu=0 c
  t0=$(now)
  /usr/bin/time -f '%M %U %S' -o "$run/recvlogical-$tx.rss" \
    "$PG_BIN/pg_recvlogical" -d "$DB_URL" --slot="$rl_slot" --start --no-loop \
      --endpos="$end_lsn" -F 0 -f /dev/null \
      -o proto_version=1 -o publication_names=outbox_pub 2>"$run/recvlogical-$tx.log" &
  local rl_pid=$!
  pids+=("$rl_pid")
  local rl_deadline=$(( SECONDS + DRAIN_TIMEOUT ))
  while kill -0 "$rl_pid" 2>/dev/null; do
    (( SECONDS < rl_deadline )) || die "pg_recvlogical did not reach $end_lsn within ${DRAIN_TIMEOUT}s"
    # The walsender exits with pg_recvlogical: keep its last CPU reading.
    if (( wpid == 0 )); then wpid=$(slot_pid "$rl_slot"); fi
    if (( wpid != 0 )); then c=$(cpu_secs "$wpid"); [[ "$c" == 0 ]] || wcpu=$c; fi
    sleep 0.05
  done
  wait "$rl_pid" || die "pg_recvlogical failed: $(tail -5 "$run/recvlogical-$tx.log")"
  t1=$(now)
  local rl_s rl_rss rl_cpu rl_wal_cpu=$wcpu
  rl_s=$(elapsed "$t0" "$t1")
  rl_rss=$(awk '{ printf "%.1f", $1 / 1024 }' "$run/recvlogical-$tx.rss")
  rl_cpu=$(awk '{ printf "%.2f", $2 + $3 }' "$run/recvlogical-$tx.rss")
  log "drain tx=$tx: pg_recvlogical ${rl_s}s → $(rate "$EVENTS" "$rl_s") events/s"
  drop_slot "$rl_slot"

  # (b) the connector, once per variant
  for k in "${!variants[@]}"; do
    v=${variants[$k]}
    use_variant "$k"
    drain_connector "$tx" "$variant_name" "bench_${id}_cdc${tx}_$k" "$end_lsn" "$end_num" "$k"
    cat >"$run/drain_tx$(printf '%04d' "$tx")_v$k.json" <<JSON
{
  "tx_size": $tx,
  "variant": "${v%%:*}",
  "variant_settings": "$( [[ $v == *:* ]] && printf '%s' "${v#*:}" )",
  "events": $EVENTS,
  "wal_bytes": $wal_bytes,
  "write_seconds": $write_s,
  "pg_recvlogical_seconds": $rl_s,
  "pg_recvlogical_events_per_s": $(rate "$EVENTS" "$rl_s"),
  "pg_recvlogical_peak_rss_mib": $rl_rss,
  "pg_recvlogical_cpu_s": $rl_cpu,
  "pg_recvlogical_walsender_cpu_s": $rl_wal_cpu,
$(cat "$run/connector-drain${tx}_$k.json")
}
JSON
  done
  if [[ $FLOOR == 1 ]]; then producer_floor "$tx"; fi
  if [[ -n $PEER ]]; then peer_debezium "$tx" "bench_${id}_dbz$tx" "$rl_s"; fi
  sql -c "TRUNCATE public.outbox_events, public.outbox_aggregate_sequences" >/dev/null
}

# The producer alone (examples/produce_floor.rs): records shaped like the
# backlog's, through the connector's KafkaSink with config/example.toml's
# Kafka settings, into a topic of their own; no PostgreSQL. Its CPU per event
# is the part of the connector's that no change before the producer can save.
# Writes floor_tx<tx>.json.
producer_floor() {
  local tx=$1 topic="$topic_prefix.floor$tx" out="$run/floor-$tx.out" pid line=""
  "$PY" bench/tools/bench.py topics-create "$OUTBOX_CDC_TEST_KAFKA" "$PARTITIONS" "$topic" >&2
  topics+=("$topic")
  log "drain tx=$tx [producer floor]: $EVENTS records through the KafkaSink alone → $topic"
  local kpid k0
  kpid=$(kafka_pid)
  k0=$(cpu_secs "$kpid")
  OUTBOX_CDC__POSTGRES__URL="$DB_URL" \
  OUTBOX_CDC__KAFKA__BOOTSTRAP_SERVERS="$OUTBOX_CDC_TEST_KAFKA" \
    "$FLOOR_BIN" config/example.toml "$topic" "$EVENTS" "$AGGREGATES" >"$out" 2>"$run/floor-$tx.log" &
  pid=$!
  pids+=("$pid")
  local deadline=$(( SECONDS + DRAIN_TIMEOUT ))
  while [[ -z $line ]]; do
    kill -0 "$pid" 2>/dev/null || die "produce_floor exited: $(tail -5 "$run/floor-$tx.log")"
    (( SECONDS < deadline )) || die "produce_floor did not finish within ${DRAIN_TIMEOUT}s"
    sleep 0.1
    line=$(head -1 "$out")
  done
  local cpu rss kafka_cpu
  cpu=$(cpu_secs "$pid")
  rss=$(peak_rss_mib "$pid")
  kafka_cpu=$(awk -v a="$k0" -v b="$(cpu_secs "$kpid")" 'BEGIN { printf "%.2f", b - a }')
  stop_pid "$pid"
  log "drain tx=$tx [producer floor]: $line, CPU s $cpu + Kafka broker $kafka_cpu, peak RSS $rss MiB"
  "$PY" - "$line" "$tx" "$cpu" "$rss" "$kafka_cpu" >"$run/floor_tx$(printf '%04d' "$tx").json" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
r.update(tx_size=int(sys.argv[2]), cpu_s=float(sys.argv[3]), peak_rss_mib=float(sys.argv[4]),
         kafka_broker_cpu_s=float(sys.argv[5]))
print(json.dumps(r))
PY
}

DBZ_JARS="$root/target/bench/debezium-jars"
ensure_debezium_jars() {
  local marker="$DBZ_JARS/.complete" want
  want=$(sha256sum bench/debezium/pom.xml | cut -c1-64)
  [[ -r $marker && $(cat "$marker") == "$want" ]] && return 0
  command -v mvn >/dev/null || die "BENCH_PEER=debezium needs Maven (mvn) to fetch the Debezium jars"
  rm -rf "$DBZ_JARS"
  log "peer: resolving Kafka Connect and Debezium jars with Maven into $DBZ_JARS"
  mvn -B -q -Dstyle.color=never -f bench/debezium/pom.xml dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$DBZ_JARS" >"$run/mvn-debezium.log" 2>&1 ||
    die "Maven could not resolve the Debezium jars: $(tail -5 "$run/mvn-debezium.log")"
  printf '%s' "$want" >"$marker"
}

# Debezium drains the backlog from SLOT into its own topic, routed by the
# Outbox Event Router like ours (key = aggregate_id, value = payload as text,
# id header); done when the topic holds every event. Writes peer_tx<tx>.json.
peer_debezium() {
  local tx=$1 slot=$2 rl_s=$3
  local topic="$topic_prefix.dbz$tx" dir="$run/debezium-$tx"
  ensure_debezium_jars
  "$PY" bench/tools/bench.py topics-create "$OUTBOX_CDC_TEST_KAFKA" "$PARTITIONS" "$topic" >&2
  topics+=("$topic")
  mkdir -p "$dir"
  local port
  port=$(free_port)
  cat >"$dir/worker.properties" <<PROPS
bootstrap.servers=$OUTBOX_CDC_TEST_KAFKA
key.converter=org.apache.kafka.connect.storage.StringConverter
value.converter=org.apache.kafka.connect.storage.StringConverter
offset.storage.file.filename=$dir/offsets
offset.flush.interval.ms=1000
listeners=http://127.0.0.1:$port
plugin.path=
PROPS
  "$PY" - "$DB_URL" "$slot" "$topic" >"$dir/connector.properties" <<'PY'
import sys, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
print(f"""name=bench-debezium
connector.class=io.debezium.connector.postgresql.PostgresConnector
tasks.max=1
database.hostname={u.hostname}
database.port={u.port}
database.user={urllib.parse.unquote(u.username)}
database.password={urllib.parse.unquote(u.password or '')}
database.dbname={u.path.lstrip('/')}
topic.prefix=benchdbz
plugin.name=pgoutput
slot.name={sys.argv[2]}
publication.name=outbox_pub
publication.autocreate.mode=disabled
snapshot.mode=no_data
table.include.list=public.outbox_events
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.table.field.event.id=event_id
transforms.outbox.table.field.event.key=aggregate_id
transforms.outbox.table.field.event.payload=payload
transforms.outbox.route.by.field=aggregate_type
transforms.outbox.route.topic.replacement={sys.argv[3]}""")
PY
  log "drain tx=$tx [peer debezium]: Kafka Connect standalone → $topic until it holds $EVENTS records"
  local t0 t1 pid cpu=0 c rss=0 r n=0
  t0=$(now)
  java -Xmx1g -Dlog4j2.level=WARN -cp "$DBZ_JARS/*" org.apache.kafka.connect.cli.ConnectStandalone \
    "$dir/worker.properties" "$dir/connector.properties" >"$dir/connect.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  local deadline=$(( SECONDS + DRAIN_TIMEOUT ))
  while :; do
    kill -0 "$pid" 2>/dev/null || die "Debezium exited: $(grep -m3 -E 'ERROR|Exception' "$dir/connect.log")"
    (( SECONDS < deadline )) || die "Debezium did not deliver $EVENTS records within ${DRAIN_TIMEOUT}s ($n so far)"
    c=$(cpu_secs "$pid"); [[ $c == 0 ]] || cpu=$c
    r=$(peak_rss_mib "$pid"); [[ $r == 0 ]] || rss=$r
    n=$("$PY" bench/tools/bench.py end-offsets "$OUTBOX_CDC_TEST_KAFKA" "$topic")
    (( n >= EVENTS )) && break
    sleep 0.5
  done
  t1=$(now)
  c=$(cpu_secs "$pid"); [[ $c == 0 ]] || cpu=$c
  r=$(peak_rss_mib "$pid"); [[ $r == 0 ]] || rss=$r
  local wcpu
  wcpu=$(cpu_secs "$(slot_pid "$slot")")
  stop_pid "$pid"
  drop_slot "$slot"
  local s
  s=$(elapsed "$t0" "$t1")
  log "drain tx=$tx [peer debezium]: ${s}s → $(rate "$EVENTS" "$s") events/s, CPU s $cpu (its walsender $wcpu), peak RSS $rss MiB"
  cat >"$run/peer_tx$(printf '%04d' "$tx").json" <<JSON
{
  "name": "debezium",
  "version": "Debezium 3.6.1.Final, Kafka Connect 4.1.1 standalone, Outbox Event Router",
  "tx_size": $tx,
  "events": $EVENTS,
  "records": $n,
  "seconds": $s,
  "events_per_s": $(rate "$EVENTS" "$s"),
  "cpu_s": $cpu,
  "walsender_cpu_s": ${wcpu:-0},
  "peak_rss_mib": $rss,
  "pg_recvlogical_events_per_s": $(rate "$EVENTS" "$rl_s"),
  "note": "from process start (JVM start-up included) until the topic holds every event; records counted by end offsets"
}
JSON
}

# Runs the connector (conn_bin, conn_env) on one slot until its acked LSN
# reaches the end; writes its figures as JSON members to connector-drain<tx>_<k>.json.
drain_connector() {
  local tx=$1 variant=$2 slot=$3 end_lsn=$4 end_num=$5 k=$6
  local name="drain${tx}_$k" kpid k0 k1 t0 wpid=0
  log "drain tx=$tx [$variant]: outbox-cdc → Kafka (acks=all) until acked LSN >= $end_lsn"
  kpid=$(kafka_pid)
  k0=$(cpu_secs "$kpid")
  t0=$(now)
  start_connector "$slot" "$name"
  local pub_t="" ack_t="" m acked published deadline=$(( SECONDS + DRAIN_TIMEOUT ))
  while :; do
    kill -0 "$conn_pid" 2>/dev/null || die "the connector exited: $(tail -5 "$run/connector-$name.log")"
    (( SECONDS < deadline )) || die "the connector did not reach $end_lsn within ${DRAIN_TIMEOUT}s"
    if m=$(curl -fsS --max-time 2 "http://127.0.0.1:$conn_port/metrics" 2>/dev/null); then
      published=$(metric outbox_cdc_events_published_total <<<"$m")
      acked=$(metric outbox_cdc_acked_lsn <<<"$m")
      if [[ -z "$pub_t" ]] && (( published >= EVENTS )); then pub_t=$(now); fi
      if (( wpid == 0 )); then wpid=$(slot_pid "$slot"); fi
      if awk -v a="$acked" -v e="$end_num" 'BEGIN { exit !(a >= e) }'; then ack_t=$(now); break; fi
    fi
    sleep 0.1
  done
  local conn_rss conn_s pub_s conn_cpu conn_wal_cpu kafka_cpu
  conn_rss=$(peak_rss_mib "$conn_pid")
  conn_cpu=$(cpu_secs "$conn_pid")
  local threads
  threads=$(thread_stats "$conn_pid")
  conn_wal_cpu=$(cpu_secs "$wpid")
  k1=$(cpu_secs "$kpid")
  kafka_cpu=$(awk -v a="$k0" -v b="$k1" 'BEGIN { printf "%.2f", b - a }')
  stop_pid "$conn_pid"
  if (( perf_pid != 0 )); then
    # perf writes its data and exits once its child has.
    for _ in $(seq 1 200); do kill -0 "$perf_pid" 2>/dev/null || break; sleep 0.1; done
    stop_pid "$perf_pid"
  fi
  conn_s=$(elapsed "$t0" "$ack_t")
  pub_s=$(elapsed "$t0" "${pub_t:-$ack_t}")
  log "drain tx=$tx [$variant]: outbox-cdc ${conn_s}s → $(rate "$EVENTS" "$conn_s") events/s (all published after ${pub_s}s), peak RSS ${conn_rss} MiB"
  log "drain tx=$tx [$variant]: CPU s: connector ${conn_cpu} + its walsender ${conn_wal_cpu} + Kafka broker ${kafka_cpu}; connector threads $threads"
  drop_slot "$slot"
  cat >"$run/connector-$name.json" <<JSON
  "connector_seconds": $conn_s,
  "connector_events_per_s": $(rate "$EVENTS" "$conn_s"),
  "connector_all_published_seconds": $pub_s,
  "connector_cpu_s": $conn_cpu,
  "connector_walsender_cpu_s": $conn_wal_cpu,
  "kafka_broker_cpu_s": $kafka_cpu,
  "connector_threads": $threads,
  "peak_rss_mib": $conn_rss
JSON
}

# --- 2. steady state -------------------------------------------------------------
# One steady phase for variants[$1], on a slot and a topic of its own
# (bench/steady.pgbench writes aggregate_type 'steady'); its files end in
# _v<k> (steady_v<k>.json, latency_v<k>.txt, ...).
steady() {
  local k=$1
  local slot="bench_${id}_steady$k" topic="$topic_prefix.v$k.steady" sfx="_v$k"
  use_variant "$k"
  local variant=$variant_name
  "$PY" bench/tools/bench.py topics-create "$OUTBOX_CDC_TEST_KAFKA" "$PARTITIONS" "$topic" >&2
  topics+=("$topic")
  sql -c "TRUNCATE public.outbox_events, public.outbox_aggregate_sequences, public.orders" >/dev/null
  create_slot "$slot"
  log "steady [$variant]: outbox-cdc on slot $slot → $topic"
  start_connector "$slot" "steady$k" "$topic_prefix.v$k.{aggregate_type}"
  local deadline=$(( SECONDS + 60 )) m
  until m=$(curl -fsS --max-time 2 "http://127.0.0.1:$conn_port/metrics" 2>/dev/null) \
        && [[ $(metric outbox_cdc_connected <<<"$m") == 1 ]]; do
    kill -0 "$conn_pid" 2>/dev/null || die "the connector exited: $(tail -5 "$run/connector-steady$k.log")"
    (( SECONDS < deadline )) || die "the connector did not connect within 60 s"
    sleep 0.1
  done

  local lat="$run/latency$sfx.txt" stop="$run/consumer$sfx.stop" clog="$run/consumer$sfx.log"
  rm -f "$stop"
  "$PY" -u bench/tools/bench.py consume "$OUTBOX_CDC_TEST_KAFKA" "$topic" "$lat" \
    "$stop" $(( STEADY_SECONDS + 300 )) >"$clog" 2>&1 &
  local consumer_pid=$!
  pids+=("$consumer_pid")
  deadline=$(( SECONDS + 60 ))
  until grep -q 'consumer ready' "$clog"; do
    kill -0 "$consumer_pid" 2>/dev/null || die "the consumer exited: $(tail -5 "$clog")"
    (( SECONDS < deadline )) || die "the consumer did not start within 60 s"
    sleep 0.1
  done

  # psql's \watch repeats the query in one session until stopped.
  "$PG_BIN/psql" -X -q -At "$ADMIN_DB_URL" >"$run/slot_lag$sfx.txt" 2>"$run/slot_lag$sfx.log" <<SQL &
SELECT extract(epoch FROM clock_timestamp()), pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
  FROM pg_replication_slots WHERE slot_name = '$slot' \watch 0.2
SQL
  local watch_pid=$!
  pids+=("$watch_pid")

  local rate_args=()
  [[ -n "$RATE" ]] && rate_args=(-R "$RATE")
  log "steady [$variant]: pgbench -c $CLIENTS -j $THREADS -T $STEADY_SECONDS ${rate_args[*]:-(max rate)}"
  "$PG_BIN/pgbench" -n -M prepared -f bench/steady.pgbench -c "$CLIENTS" -j "$THREADS" \
    -T "$STEADY_SECONDS" -P 5 "${rate_args[@]}" "$ADMIN_DB_URL" >"$run/pgbench$sfx.log" 2>&1 \
    || die "pgbench failed: $(tail -5 "$run/pgbench$sfx.log")"
  local tps events
  tps=$(sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p' "$run/pgbench$sfx.log")
  events=$(sql -c "SELECT count(*) FROM public.outbox_events")
  log "steady [$variant]: pgbench $tps tps, $events events; waiting for the consumer to read them all"
  deadline=$(( SECONDS + 300 ))
  while (( $(wc -l <"$lat") < events )); do
    kill -0 "$conn_pid" 2>/dev/null || die "the connector exited: $(tail -3 "$run/connector-steady$k.log")"
    if (( SECONDS >= deadline )); then log "warning: the consumer read $(wc -l <"$lat") of $events events in 300 s"; break; fi
    sleep 0.5
  done
  curl -fsS --max-time 5 "http://127.0.0.1:$conn_port/metrics" >"$run/steady_metrics$sfx.txt"
  local rss
  rss=$(peak_rss_mib "$conn_pid")
  touch "$stop"
  wait "$consumer_pid" || log "warning: the consumer failed: $(tail -3 "$clog")"
  stop_pid "$watch_pid"
  stop_pid "$conn_pid"
  drop_slot "$slot"
  cat >"$run/steady$sfx.json" <<JSON
{
  "variant": "$variant",
  "variant_settings": "$( [[ ${variants[$k]} == *:* ]] && printf '%s' "${variants[$k]#*:}" )",
  "tps": ${tps:-0},
  "events": $events,
  "seconds": $STEADY_SECONDS,
  "clients": $CLIENTS,
  "threads": $THREADS,
  "rate_limit_tps": "${RATE:-none}",
  "peak_rss_mib": $rss
}
JSON
}

for phase in $PHASES; do
  case $phase in
    drain) for tx in $TX_SIZES; do drain "$tx"; done ;;
    steady)
      if [[ $STEADY_VARIANTS == first ]]; then steady 0
      else for k in "${!variants[@]}"; do steady "$k"; done
      fi ;;
    *) die "unknown phase $phase (drain, steady)" ;;
  esac
done

"$PY" bench/tools/bench.py report "$run" "$OUT/latest.json" "$OUT/latest.png"
log "results: $OUT/latest.json, $OUT/latest.png"
