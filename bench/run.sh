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
#           (its slot created by the connector itself, started and stopped
#           before the backlog is written, so that the live witness checks
#           every row of the backlog, as in production)
#           (acks=all) until its acked LSN (/metrics outbox_cdc_acked_lsn,
#           which is persisted and reported to PostgreSQL) reaches the end LSN;
#           once per connector variant (BENCH_VARIANTS; by default both
#           delivery modes, at-least-once and exactly-once), each from a slot
#           of its own. In exactly-once mode the acked LSN moves only after
#           each Kafka commit, so the figure includes the last commit. With
#           the live witness on, also until it has checked every row
#           (connector_cpu_s_checked); a later variant with it off runs on
#           until the same time after its start (connector_cpu_s_held), so
#           the two CPU figures cover the same time.
#     Reported: events/s of both (from process start), their ratio, the
#     connector's peak RSS (VmHWM). Then, on the same backlog:
#       (c) the producer floor: examples/produce_floor.rs sends as many records
#           through the connector's KafkaSink alone (no PostgreSQL);
#       (d) the peer: Debezium (Kafka Connect standalone) drains a slot of its own.
#     Both rows are in every run's latest.json: a row that could not be
#     measured (or was skipped) says so ("measured": false, "reason").
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
#     is sampled every 200 ms. The connector's CPU seconds from just before
#     pgbench starts to when the consumer has read every event, per event.
#  3. One large transaction, pgoutput protocol 1 vs 2 (BENCH_PHASES=bigtx).
#     Alternating [postgres] streaming = off and on, BENCH_BIGTX_RUNS times
#     each: a slot and a topic of its own, the connector (the first variant,
#     plus the streaming setting) started and streaming, a consumer waiting
#     for the topic's first record, then one transaction of BENCH_BIGTX_ROWS
#     outbox rows (shaped like the backlog's) written by server-side SQL
#     (bench_insert) in one session, at the server's logical_decoding_work_mem
#     (64MB by default). Measured from the COMMIT returning: the first record
#     in Kafka, every event published, the acked LSN reaching the end of the
#     transaction's commit record (drain); the connector's peak RSS and CPU
#     seconds, its largest outbox_cdc_spill_bytes, and the slot's spill_* and
#     stream_* deltas from pg_stat_replication_slots (reset before the
#     write). Medians and every run go to the report's "bigtx" key, with the
#     targets (peak RSS <= 64 MiB; with streaming, no spill_bytes on the
#     server) met or not.
#
# This script starts and stops processes; every figure (rates, CPU, RSS,
# /metrics, the latency quantiles, the JSON) is taken by bench/tools/bench.py.
#
# Output: bench/results/latest.json, bench/results/latest.png (BENCH_OUT sets
# the directory; BENCH_PHASES=bigtx alone writes bigtx.json instead, and no
# plot); intermediate files and logs in target/bench/run-<id>/.
# latest.json's machine.versions records what ran: the outbox-cdc commit, the
# PostgreSQL server, pg_recvlogical, pgbench, Kafka, librdkafka, Java, Debezium
# and Kafka Connect (when the peer ran), rustc, the bench's consumer.
#
# Usage:
#   scripts/env.sh up && bench/run.sh                 # full run (1,000,000 events)
#   BENCH_EVENTS=200000 BENCH_STEADY_SECONDS=30 bench/run.sh   # quicker
#   BENCH_PHASES=drain bench/run.sh                   # only the catch-up
#   BENCH_VARIANTS=at-least-once bench/run.sh         # one delivery mode only
#   BENCH_PHASES=bigtx bench/run.sh                   # only the large transaction (bigtx.json)
#
# Settings (environment):
#   BENCH_EVENTS=1000000      backlog size per transaction size
#   BENCH_TX_SIZES="1 100"    events per transaction of the backlogs
#   BENCH_AGGREGATES=10000    distinct aggregate ids
#   BENCH_WRITERS=2           parallel sessions writing a backlog
#   BENCH_PARTITIONS=3        partitions of each benchmark topic
#   BENCH_PHASES="drain steady bigtx"
#   BENCH_BIGTX_ROWS=1000000  rows of the bigtx phase's one transaction
#   BENCH_BIGTX_RUNS=3        runs of each streaming setting (off, on, off, on, ...)
#   BENCH_BIGTX_STREAMING="off on"  the [postgres] streaming settings compared, in
#                             the order of each run (protocol 1 = off, 2 = on)
#   BENCH_REPORT=latest       the report's name: <BENCH_OUT>/<name>.json and .png
#                             (default "bigtx" when BENCH_PHASES is bigtx alone)
#   BENCH_STEADY_SECONDS=60  BENCH_CLIENTS=4  BENCH_THREADS=2  BENCH_RATE=(unset: max)
#   BENCH_DRAIN_TIMEOUT=1800  seconds allowed for one drain
#   BENCH_NO_BUILD=1          use target/release/outbox-cdc as it is
#   BENCH_OUT=bench/results   where latest.json / latest.png go
#   BENCH_PERF=1              record a perf profile (cpu-clock, DWARF stacks) of the
#                             connector during each drain into the run dir
#   BENCH_PEER=auto           the peer: after the connector's drains, Debezium 3.6.1
#                             (Kafka Connect 4.1.1 standalone, PostgreSQL connector,
#                             Outbox Event Router routed like ours, StringConverter)
#                             drains the same backlog from its own slot; its events/s,
#                             CPU seconds and peak RSS go to latest.json as peer[].
#                             Jars from Maven Central (bench/debezium/pom.xml, mvn).
#                             "auto": measured when BENCH_EVENTS >= 1000000 (a full
#                             run), skipped by a quicker run; "debezium": always;
#                             "none": never. Skipped or failed (no mvn, jars not
#                             resolved, Connect failed), peer[] keeps a row per
#                             transaction size with "measured": false and "reason"
#   BENCH_FLOOR=1             the producer floor: after the connector's drains, the
#                             producer alone (examples/produce_floor.rs) sends as many
#                             records shaped like the backlog's through the connector's
#                             KafkaSink; its CPU seconds go to latest.json as
#                             producer_floor[] (0: a row with "measured": false)
#   BENCH_KEEP_RUN_DIR=0      1 keeps target/bench/run-<id>/ (latency samples, logs)
#   BENCH_VARIANTS="at-least-once exactly-once:OUTBOX_CDC__DELIVERY__MODE=exactly-once"
#                             connector variants draining the same backlogs, each
#                             from its own slot: "name[:KEY=VALUE,...]" separated by
#                             spaces, KEY = an OUTBOX_CDC__* override, BIN (another
#                             binary) or CONFIG (another config file, e.g. the example
#                             config of an older commit for its binary) or WITNESS=off
#                             (a build from before the live witness: its drain does not
#                             wait for checks), e.g. "default linger50:OUTBOX_CDC__KAFKA__LINGER_MS=50";
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
# binaries), /usr/bin/time, python3 (a venv with confluent-kafka and matplotlib
# is made under target/bench/venv on first use); for the peer, java and mvn.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

EVENTS=${BENCH_EVENTS:-1000000}
TX_SIZES=${BENCH_TX_SIZES:-"1 100"}
AGGREGATES=${BENCH_AGGREGATES:-10000}
WRITERS=${BENCH_WRITERS:-2}
PARTITIONS=${BENCH_PARTITIONS:-3}
PHASES=${BENCH_PHASES:-"drain steady bigtx"}
BIGTX_ROWS=${BENCH_BIGTX_ROWS:-1000000}
BIGTX_RUNS=${BENCH_BIGTX_RUNS:-3}
BIGTX_STREAMING=${BENCH_BIGTX_STREAMING:-"off on"}
REPORT=${BENCH_REPORT:-latest}
read -r -a phase_list <<<"$PHASES"
if [[ -z ${BENCH_REPORT:-} && ${#phase_list[@]} -eq 1 && ${phase_list[0]} == bigtx ]]; then REPORT=bigtx; fi
STEADY_SECONDS=${BENCH_STEADY_SECONDS:-60}
CLIENTS=${BENCH_CLIENTS:-4}
THREADS=${BENCH_THREADS:-2}
RATE=${BENCH_RATE:-}
DRAIN_TIMEOUT=${BENCH_DRAIN_TIMEOUT:-1800}
PEER=${BENCH_PEER:-auto}
FLOOR=${BENCH_FLOOR:-1}
[[ $FLOOR == 0 || $FLOOR == 1 ]] || { echo "bench: BENCH_FLOOR=$FLOOR: 0 or 1" >&2; exit 2; }
[[ $PEER == auto || $PEER == debezium || $PEER == none ]] ||
  { echo "bench: BENCH_PEER=$PEER: auto, debezium or none" >&2; exit 2; }
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
[[ -x /usr/bin/time ]] || die "/usr/bin/time not found (Debian's package time)"
export BENCH_PSQL="$PG_BIN/psql"
[[ "$EVENTS" =~ ^[0-9]+$ && "$EVENTS" -gt 0 ]] || die "BENCH_EVENTS must be a positive integer"
[[ "$BIGTX_ROWS" =~ ^[0-9]+$ && "$BIGTX_ROWS" -gt 0 ]] || die "BENCH_BIGTX_ROWS must be a positive integer"
[[ "$BIGTX_RUNS" =~ ^[0-9]+$ && "$BIGTX_RUNS" -gt 0 ]] || die "BENCH_BIGTX_RUNS must be a positive integer"
read -r -a bigtx_modes <<<"$BIGTX_STREAMING"
(( ${#bigtx_modes[@]} )) || die "BENCH_BIGTX_STREAMING is empty"
for mode in "${bigtx_modes[@]}"; do
  [[ $mode == off || $mode == on ]] || die "BENCH_BIGTX_STREAMING: $mode is neither off nor on"
done
has_drain=0
for phase in "${phase_list[@]}"; do
  [[ $phase == drain || $phase == steady || $phase == bigtx ]] || die "unknown phase $phase (drain, steady, bigtx)"
  if [[ $phase == drain ]]; then has_drain=1; fi
done

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
    bench topics-delete "$OUTBOX_CDC_TEST_KAFKA" "${topics[@]}" >&2
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
[[ $FLOOR == 0 || $has_drain == 0 || -x "$FLOOR_BIN" ]] || die "$FLOOR_BIN not found (cargo build --release --example produce_floor)"

bench() { "$PY" bench/tools/bench.py "$@"; }
free_port() { bench free-port; }

# --- the peer's jars -------------------------------------------------------------
# peer_reason: why the peer is not measured in this run (empty: it is).
peer_reason=""
case $PEER in
  none) peer_reason="skipped: BENCH_PEER=none" ;;
  auto) if (( EVENTS < 1000000 )); then
          peer_reason="skipped: a quicker run (BENCH_EVENTS=$EVENTS < 1000000); BENCH_PEER=debezium measures it"
        fi ;;
esac
(( has_drain )) || peer_reason="skipped: no drain phase (BENCH_PHASES=$PHASES)"
DBZ_JARS="$root/target/bench/debezium-jars"
JAVA=${OUTBOX_CDC_JAVA:-java}
# Kafka Connect and Debezium from Maven Central into $DBZ_JARS, once per
# bench/debezium/pom.xml; sets peer_reason when they cannot be had.
ensure_debezium_jars() {
  local marker="$DBZ_JARS/.complete" want
  want=$(sha256sum bench/debezium/pom.xml | cut -c1-64)
  command -v "$JAVA" >/dev/null || { peer_reason="failed: $JAVA (Java) not found"; return 0; }
  [[ -r $marker && $(cat "$marker") == "$want" ]] && return 0
  command -v mvn >/dev/null ||
    { peer_reason="failed: Maven (mvn) not found on PATH: the Debezium jars cannot be resolved"; return 0; }
  rm -rf "$DBZ_JARS"
  log "peer: resolving Kafka Connect and Debezium jars with Maven into $DBZ_JARS"
  if mvn -B -q -Dstyle.color=never -f bench/debezium/pom.xml dependency:copy-dependencies \
       -DincludeScope=runtime -DoutputDirectory="$DBZ_JARS" >"$run/mvn-debezium.log" 2>&1; then
    printf '%s' "$want" >"$marker"
  else
    peer_reason="failed: Maven could not resolve bench/debezium/pom.xml: $(grep -m1 ERROR "$run/mvn-debezium.log" ||
                                                                          tail -1 "$run/mvn-debezium.log")"
  fi
}
if [[ -z $peer_reason ]]; then ensure_debezium_jars; fi
if [[ -n $peer_reason ]]; then log "peer: $peer_reason"; fi

# --- machine -----------------------------------------------------------------
"$PG_BIN/psql" -X -q -At "$ADMIN_URL" -c 'SELECT 1' >/dev/null || die "PostgreSQL is not reachable: scripts/env.sh status"
jars_args=()
if [[ -z $peer_reason ]]; then jars_args=(--debezium-jars "$DBZ_JARS"); fi
bench machine "$run/machine.json" --admin-url "$ADMIN_URL" --kafka-classpath "${OUTBOX_CDC_KAFKA_CLASSPATH:-}" \
  --pg-bin "$PG_BIN" --java "$JAVA" "${jars_args[@]}"
env | grep '^OUTBOX_CDC__' | sed 's|://[^@]*@|://***@|' | sort >"$run/connector_env_overrides.txt" || true
bench config "$run/config.json" --events "$EVENTS" --tx-sizes "$TX_SIZES" --aggregates "$AGGREGATES" \
  --partitions "$PARTITIONS" --writers "$WRITERS" --steady-seconds "$STEADY_SECONDS" --clients "$CLIENTS" \
  --threads "$THREADS" --rate "$RATE" --variants "$VARIANTS" --steady-variants "$STEADY_VARIANTS" \
  --overrides "$run/connector_env_overrides.txt" --peer "$PEER" --floor "$FLOOR" --phases "$PHASES" \
  --bigtx-rows "$BIGTX_ROWS" --bigtx-runs "$BIGTX_RUNS"

# --- database and topics -------------------------------------------------------
log "run $id: database $DB, topics $topic_prefix.*, files $run"
"$PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 "$ADMIN_URL" -c "CREATE DATABASE $DB" >/dev/null
created_db=1
for f in migrations/*.sql bench/sql/setup.sql; do sql -f "$f" >/dev/null; done
# The bigtx phase finds its transaction's commit record with it (PostgreSQL 15+).
sql -c "CREATE EXTENSION IF NOT EXISTS pg_walinspect" >/dev/null 2>&1 || log "no pg_walinspect: bigtx ends at the insert LSN"
sql -c "GRANT SELECT ON public.outbox_events TO outbox" >/dev/null

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

kafka_pid() { cat "${OUTBOX_CDC_ENV_DIR:-target/env}/kafka.pid" 2>/dev/null || echo 0; }

conn_env=()
conn_witness=1
conn_bin=$BIN
conn_config=config/example.toml
perf_pid=0
# Starts the connector in the background; sets conn_pid and conn_port, and
# perf_pid when BENCH_PERF is set and this is a drain (perf runs the connector
# as its child, so threads created later, e.g. librdkafka's, are sampled too).
# With conn_keep_offsets=1 the offsets of an earlier start under the same
# name stay (a drain after its priming); with conn_create_slot=true the
# connector creates its slot.
start_connector() {
  local slot=$1 name=$2 topic_template=${3:-"$topic_prefix.{aggregate_type}"}
  local wrapper=()
  conn_port=$(free_port)
  [[ ${conn_keep_offsets:-0} == 1 ]] || rm -rf "$run/offsets-$name"
  perf_pid=0
  if [[ -n "${BENCH_PERF:-}" && $name == drain* && ${conn_create_slot:-false} == false ]]; then
    # Software clock: works without access to hardware counters.
    wrapper=(perf record -q -e cpu-clock -F "${BENCH_PERF_FREQ:-499}" --call-graph "dwarf,32768"
             -o "$run/perf-$name.data" --)
  fi
  OUTBOX_CDC__POSTGRES__URL="$DB_URL" \
  OUTBOX_CDC__POSTGRES__SLOT="$slot" \
  OUTBOX_CDC__POSTGRES__PUBLICATION=outbox_pub \
  OUTBOX_CDC__POSTGRES__CREATE_SLOT="${conn_create_slot:-false}" \
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
  conn_witness=1
  if [[ $v == *:* ]]; then
    IFS=, read -r -a kvs <<<"${v#*:}"
    for kv in "${kvs[@]}"; do
      kv=${kv//;/,}  # `;` in a value stands for `,` (list values)
      case $kv in
        BIN=*) conn_bin=${kv#BIN=} ;;
        CONFIG=*) conn_config=${kv#CONFIG=} ;;
        WITNESS=off) conn_witness=0 ;;  # a build from before the live witness
        OUTBOX_CDC__*=*) conn_env+=("$kv") ;;
        *) die "variant $v: $kv is neither BIN=..., CONFIG=..., WITNESS=off nor OUTBOX_CDC__...=..." ;;
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
  local agg_type="drain$tx" rl_slot="bench_${id}_rl$tx" topic="$topic_prefix.drain$tx" f4
  local v k
  f4=$(printf '%04d' "$tx")
  bench topics-create "$OUTBOX_CDC_TEST_KAFKA" "$PARTITIONS" "$topic" >&2
  topics+=("$topic")
  sql -c "TRUNCATE public.outbox_events, public.outbox_aggregate_sequences" >/dev/null
  # Every slot exists before the backlog is written, so each sees all of it.
  # Each variant's connector creates its own slot and stops (priming): as in
  # production, the slot's creation gives the live witness its start, so the
  # witness checks every row of the backlog during the drain.
  create_slot "$rl_slot"
  for k in "${!variants[@]}"; do prime_connector "$k" "$tx" "bench_${id}_cdc${tx}_$k"; done
  if [[ -z $peer_reason ]]; then create_slot "bench_${id}_dbz$tx"; fi

  log "drain tx=$tx: writing $EVENTS events in transactions of $tx"
  local start_lsn end_lsn started ended
  start_lsn=$(sql -c "SELECT pg_current_wal_insert_lsn()")
  started=$EPOCHREALTIME
  local writers=() w
  for (( w = 0; w < WRITERS; w++ )); do
    sql -c "SET synchronous_commit = off" \
        -c "CALL bench_fill($EVENTS, $tx, '$agg_type', $AGGREGATES, $w, $WRITERS)" &
    writers+=($!)
  done
  for w in "${writers[@]}"; do wait "$w" || die "writing the backlog failed"; done
  ended=$EPOCHREALTIME
  end_lsn=$(sql -c "SELECT pg_current_wal_insert_lsn()")
  bench backlog --db-url "$ADMIN_DB_URL" --start-lsn "$start_lsn" --end-lsn "$end_lsn" --started "$started" \
    --ended "$ended" --events "$EVENTS" --tx "$tx" --label "drain tx=$tx" --out "$run/backlog-$tx.json" ||
    die "drain tx=$tx: the backlog"

  # (a) pg_recvlogical
  log "drain tx=$tx: pg_recvlogical → /dev/null up to $end_lsn"
  started=$EPOCHREALTIME
  /usr/bin/time -f '%M %U %S' -o "$run/recvlogical-$tx.rss" \
    "$PG_BIN/pg_recvlogical" -d "$DB_URL" --slot="$rl_slot" --start --no-loop \
      --endpos="$end_lsn" -F 0 -f /dev/null \
      -o proto_version=1 -o publication_names=outbox_pub 2>"$run/recvlogical-$tx.log" &
  local rl_pid=$!
  pids+=("$rl_pid")
  bench watch-recvlogical --pid "$rl_pid" --slot "$rl_slot" --db-url "$ADMIN_DB_URL" --started "$started" \
    --timeout "$DRAIN_TIMEOUT" --time-file "$run/recvlogical-$tx.rss" --events "$EVENTS" \
    --label "drain tx=$tx" --out "$run/recvlogical-$tx.json" || die "drain tx=$tx: pg_recvlogical"
  wait "$rl_pid" || die "pg_recvlogical failed: $(tail -5 "$run/recvlogical-$tx.log")"
  drop_slot "$rl_slot"

  # (b) the connector, once per variant
  for k in "${!variants[@]}"; do
    v=${variants[$k]}
    use_variant "$k"
    drain_connector "$tx" "$variant_name" "bench_${id}_cdc${tx}_$k" "$end_lsn" "$k"
    bench drain-run --backlog "$run/backlog-$tx.json" --recvlogical "$run/recvlogical-$tx.json" \
      --connector "$run/connector-drain${tx}_$k.json" --variant "${v%%:*}" \
      --settings "$( [[ $v == *:* ]] && printf '%s' "${v#*:}" )" --out "$run/drain_tx${f4}_v$k.json"
  done
  # (c) the producer floor, (d) the peer: a row each, measured or not.
  if [[ $FLOOR == 1 ]]; then
    producer_floor "$tx"
  else
    bench unmeasured floor --tx "$tx" --events "$EVENTS" --reason "skipped: BENCH_FLOOR=0" \
      --out "$run/floor_tx$f4.json"
  fi
  if [[ -z $peer_reason ]]; then
    peer_debezium "$tx" "bench_${id}_dbz$tx"
  else
    bench unmeasured peer --tx "$tx" --events "$EVENTS" --reason "$peer_reason" --jars "$DBZ_JARS" \
      --out "$run/peer_tx$f4.json"
  fi
  sql -c "TRUNCATE public.outbox_events, public.outbox_aggregate_sequences" >/dev/null
}

# The producer alone (examples/produce_floor.rs): records shaped like the
# backlog's, through the connector's KafkaSink with config/example.toml's
# Kafka settings, into a topic of their own; no PostgreSQL. Its CPU per event
# is the part of the connector's that no change before the producer can save.
# Writes floor_tx<tx>.json.
producer_floor() {
  local tx=$1
  local topic="$topic_prefix.floor$tx" pid
  bench topics-create "$OUTBOX_CDC_TEST_KAFKA" "$PARTITIONS" "$topic" >&2
  topics+=("$topic")
  log "drain tx=$tx [producer floor]: $EVENTS records through the KafkaSink alone → $topic"
  : >"$run/floor-$tx.out"
  OUTBOX_CDC__POSTGRES__URL="$DB_URL" \
  OUTBOX_CDC__KAFKA__BOOTSTRAP_SERVERS="$OUTBOX_CDC_TEST_KAFKA" \
    "$FLOOR_BIN" config/example.toml "$topic" "$EVENTS" "$AGGREGATES" >"$run/floor-$tx.out" 2>"$run/floor-$tx.log" &
  pid=$!
  pids+=("$pid")
  bench watch-floor --pid "$pid" --kafka-pid "$(kafka_pid)" --stdout "$run/floor-$tx.out" --timeout "$DRAIN_TIMEOUT" \
    --tx "$tx" --label "drain tx=$tx [producer floor]" --log "$run/floor-$tx.log" \
    --out "$run/floor_tx$(printf '%04d' "$tx").json" || die "drain tx=$tx: the producer floor"
  stop_pid "$pid"
}

# Debezium drains the backlog from SLOT into its own topic, routed by the
# Outbox Event Router like ours (key = aggregate_id, value = payload as text,
# id header); done when the topic holds every event. Writes peer_tx<tx>.json,
# with "measured": false and the reason when Connect or the connector fails.
peer_debezium() {
  local tx=$1 slot=$2
  local topic="$topic_prefix.dbz$tx" dir="$run/debezium-$tx"
  bench topics-create "$OUTBOX_CDC_TEST_KAFKA" "$PARTITIONS" "$topic" >&2
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
  bench peer-config --db-url "$DB_URL" --slot "$slot" --topic "$topic" --out "$dir/connector.properties"
  log "drain tx=$tx [peer debezium]: Kafka Connect standalone → $topic until it holds $EVENTS records"
  local started pid
  started=$EPOCHREALTIME
  "$JAVA" -Xmx1g -Dlog4j2.level=WARN -cp "$DBZ_JARS/*" org.apache.kafka.connect.cli.ConnectStandalone \
    "$dir/worker.properties" "$dir/connector.properties" >"$dir/connect.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  bench watch-peer --pid "$pid" --tx "$tx" --events "$EVENTS" --timeout "$DRAIN_TIMEOUT" \
    --bootstrap "$OUTBOX_CDC_TEST_KAFKA" --topic "$topic" --started "$started" --slot "$slot" \
    --db-url "$ADMIN_DB_URL" --label "drain tx=$tx [peer debezium]" --recvlogical "$run/recvlogical-$tx.json" \
    --log "$dir/connect.log" --connect-url "http://127.0.0.1:$port" --jars "$DBZ_JARS" \
    --out "$run/peer_tx$(printf '%04d' "$tx").json" || die "drain tx=$tx: watching the peer"
  stop_pid "$pid"
  drop_slot "$slot"
}

# Runs the connector (conn_bin, conn_env) on one slot until its acked LSN
# reaches the end; its figures go to connector-drain<tx>_<k>.json.
# Variant $1's connector creates slot $3 for the drain of tx=$2, connects
# and stops, before the backlog is written.
prime_connector() {
  local k=$1 tx=$2 slot=$3
  local name="drain${tx}_$k"
  use_variant "$k"
  log "drain tx=$tx [$variant_name]: the connector creates slot $slot (priming)"
  conn_create_slot=true start_connector "$slot" "$name"
  bench wait-metric --pid "$conn_pid" --metrics "http://127.0.0.1:$conn_port/metrics" \
    --name outbox_cdc_connected --at-least 1 --timeout 60 --log "$run/connector-$name.log" ||
    die "drain tx=$tx [$variant_name]: the connector did not create its slot"
  cp "$run/connector-$name.log" "$run/connector-$name-priming.log"
  stop_pid "$conn_pid"
}

drain_connector() {
  local tx=$1 variant=$2 slot=$3 end_lsn=$4 k=$5
  local name="drain${tx}_$k" started kpid
  log "drain tx=$tx [$variant]: outbox-cdc → Kafka (acks=all) until acked LSN >= $end_lsn"
  kpid=$(kafka_pid)
  started=$EPOCHREALTIME
  conn_keep_offsets=1 start_connector "$slot" "$name"
  # With the live witness on (the default), also until it has checked every
  # drained row (drain.*.witness_checked_rows, connector_cpu_s_checked).
  local checked=$EVENTS hold=0
  [[ " ${conn_env[*]} " == *" OUTBOX_CDC__RECONCILE__ENABLED=false "* ]] && checked=0
  (( conn_witness == 0 )) && checked=0
  # A variant without the witness runs on until the first variant's witness
  # had checked every row, and its CPU then (connector_cpu_s_held) is the one
  # to set against connector_cpu_s_checked: both over the same time.
  if (( checked == 0 && k > 0 )) && [[ -s "$run/connector-drain${tx}_0.json" ]]; then
    hold=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("witness_checked_seconds", 0))' \
      "$run/connector-drain${tx}_0.json")
  fi
  bench wait-lsn --pid "$conn_pid" --metrics "http://127.0.0.1:$conn_port/metrics" --end-lsn "$end_lsn" \
    --expect-checked "$checked" --hold-until "$hold" \
    --events "$EVENTS" --started "$started" --timeout "$DRAIN_TIMEOUT" --slot "$slot" --db-url "$ADMIN_DB_URL" \
    --kafka-pid "$kpid" --log "$run/connector-$name.log" --label "drain tx=$tx [$variant]" \
    --out "$run/connector-$name.json" || die "drain tx=$tx [$variant]: the connector"
  stop_pid "$conn_pid"
  if (( perf_pid != 0 )); then
    # perf writes its data and exits once its child has.
    for _ in $(seq 1 200); do kill -0 "$perf_pid" 2>/dev/null || break; sleep 0.1; done
    stop_pid "$perf_pid"
  fi
  drop_slot "$slot"
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
  bench topics-create "$OUTBOX_CDC_TEST_KAFKA" "$PARTITIONS" "$topic" >&2
  topics+=("$topic")
  sql -c "TRUNCATE public.outbox_events, public.outbox_aggregate_sequences, public.orders" >/dev/null
  create_slot "$slot"
  log "steady [$variant]: outbox-cdc on slot $slot → $topic"
  start_connector "$slot" "steady$k" "$topic_prefix.v$k.{aggregate_type}"
  bench wait-metric --pid "$conn_pid" --metrics "http://127.0.0.1:$conn_port/metrics" \
    --name outbox_cdc_connected --at-least 1 --timeout 60 --log "$run/connector-steady$k.log" ||
    die "steady [$variant]: the connector did not connect"

  local lat="$run/latency$sfx.txt" stop="$run/consumer$sfx.stop" clog="$run/consumer$sfx.log"
  rm -f "$stop"
  "$PY" -u bench/tools/bench.py consume "$OUTBOX_CDC_TEST_KAFKA" "$topic" "$lat" \
    "$stop" $(( STEADY_SECONDS + 300 )) >"$clog" 2>&1 &
  local consumer_pid=$!
  pids+=("$consumer_pid")
  local deadline=$(( SECONDS + 60 ))
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

  local rate_args=() cpu_before
  [[ -n "$RATE" ]] && rate_args=(-R "$RATE")
  cpu_before=$(bench cpu-seconds --pid "$conn_pid")
  log "steady [$variant]: pgbench -c $CLIENTS -j $THREADS -T $STEADY_SECONDS ${rate_args[*]:-(max rate)}"
  "$PG_BIN/pgbench" -n -M prepared -f bench/steady.pgbench -c "$CLIENTS" -j "$THREADS" \
    -T "$STEADY_SECONDS" -P 5 "${rate_args[@]}" "$ADMIN_DB_URL" >"$run/pgbench$sfx.log" 2>&1 \
    || die "pgbench failed: $(tail -5 "$run/pgbench$sfx.log")"
  bench watch-steady --pid "$conn_pid" --db-url "$ADMIN_DB_URL" --latency "$lat" --timeout 300 \
    --metrics "http://127.0.0.1:$conn_port/metrics" --metrics-out "$run/steady_metrics$sfx.txt" \
    --pgbench-log "$run/pgbench$sfx.log" --log "$run/connector-steady$k.log" --label "steady [$variant]" \
    --variant "$variant" --settings "$( [[ ${variants[$k]} == *:* ]] && printf '%s' "${variants[$k]#*:}" )" \
    --seconds "$STEADY_SECONDS" --clients "$CLIENTS" --threads "$THREADS" --rate "$RATE" \
    --cpu-before "$cpu_before" --out "$run/steady$sfx.json" || die "steady [$variant]"
  touch "$stop"
  wait "$consumer_pid" || log "warning: the consumer failed: $(tail -3 "$clog")"
  stop_pid "$watch_pid"
  stop_pid "$conn_pid"
  drop_slot "$slot"
}

# --- 3. one large transaction, protocol 1 vs 2 ---------------------------------------
# Run $1 of streaming setting $2 (off or on; k = 0 or 1 orders the files): a
# slot and a topic of its own, the first variant's connector with
# OUTBOX_CDC__POSTGRES__STREAMING=$2 streaming before the transaction is
# written, a consumer waiting for the topic's first record. Writes
# bigtx_r<run>_v<k>.json.
bigtx() {
  local r=$1 mode=$2 k=$3
  local name="bigtx${r}_$mode" slot="bench_${id}_bigtx${r}_$mode" topic="$topic_prefix.bigtx.r$r.$mode"
  local commit="$run/$name.commit" first="$run/$name.first" clog="$run/consumer-$name.log"
  local wlog="$run/watch-$name.log" settings
  use_variant 0
  conn_env+=("OUTBOX_CDC__POSTGRES__STREAMING=$mode")
  settings=$(IFS=,; printf '%s' "${conn_env[*]}")
  bench topics-create "$OUTBOX_CDC_TEST_KAFKA" "$PARTITIONS" "$topic" >&2
  topics+=("$topic")
  sql -c "TRUNCATE public.outbox_events, public.outbox_aggregate_sequences" >/dev/null
  # Each run starts from a checkpoint: the full-page images after it are
  # part of every run's WAL alike.
  sql -c "CHECKPOINT" >/dev/null
  create_slot "$slot"
  log "bigtx run $r [streaming $mode]: outbox-cdc on slot $slot → $topic"
  start_connector "$slot" "$name" "$topic"
  bench wait-metric --pid "$conn_pid" --metrics "http://127.0.0.1:$conn_port/metrics" \
    --name outbox_cdc_connected --at-least 1 --timeout 60 --log "$run/connector-$name.log" \
    --slot "$slot" --db-url "$ADMIN_DB_URL" || die "bigtx [streaming $mode]: the connector did not connect"

  "$PY" -u bench/tools/bench.py first-record "$OUTBOX_CDC_TEST_KAFKA" "$topic" "$first" "$DRAIN_TIMEOUT" \
    >"$clog" 2>&1 &
  local consumer_pid=$!
  pids+=("$consumer_pid")
  "$PY" -u bench/tools/bench.py watch-bigtx --pid "$conn_pid" --metrics "http://127.0.0.1:$conn_port/metrics" \
    --slot "$slot" --db-url "$ADMIN_DB_URL" --commit-file "$commit" --first-file "$first" --rows "$BIGTX_ROWS" \
    --run "$r" --streaming "$mode" --variant "$variant_name" --settings "$settings" --timeout "$DRAIN_TIMEOUT" \
    --kafka-pid "$(kafka_pid)" --log "$run/connector-$name.log" --label "bigtx run $r [streaming $mode]" \
    --out "$run/bigtx_r${r}_v$k.json" >"$wlog" 2>&1 &
  local watch_pid=$!
  pids+=("$watch_pid")
  local deadline=$(( SECONDS + 60 ))
  until grep -q 'consumer ready' "$clog" && grep -q 'bench: watching' "$wlog"; do
    kill -0 "$consumer_pid" 2>/dev/null || die "the consumer exited: $(tail -5 "$clog")"
    kill -0 "$watch_pid" 2>/dev/null || die "bigtx [streaming $mode]: $(tail -5 "$wlog")"
    (( SECONDS < deadline )) || die "the consumer or the watcher did not start within 60 s"
    sleep 0.1
  done

  log "bigtx run $r [streaming $mode]: writing one transaction of $BIGTX_ROWS rows"
  # Before and after (once COMMIT has returned), in the writer's session:
  # the WAL insert position and the server's clock.
  local at="SELECT pg_current_wal_insert_lsn(), extract(epoch FROM clock_timestamp())"
  sql -c "$at" -c "BEGIN" -c "SELECT bench_insert($BIGTX_ROWS, 'bigtx', $AGGREGATES)" -c "COMMIT" -c "$at" \
    >"$commit.tmp" || die "bigtx [streaming $mode]: writing the transaction failed"
  mv "$commit.tmp" "$commit"
  wait "$watch_pid" || die "bigtx run $r [streaming $mode]: $(grep -m1 'error' "$wlog" || tail -3 "$wlog")"
  cat "$wlog" >&2
  wait "$consumer_pid" || log "warning: the consumer failed: $(tail -3 "$clog")"
  stop_pid "$conn_pid"
  drop_slot "$slot"
  rm -rf "$run/offsets-$name"
  # A million records a run: the topic goes now, not at the end.
  bench topics-delete "$OUTBOX_CDC_TEST_KAFKA" "$topic" >&2
  local t kept=()
  for t in "${topics[@]}"; do [[ $t == "$topic" ]] || kept+=("$t"); done
  topics=("${kept[@]}")
}

for phase in "${phase_list[@]}"; do
  case $phase in
    drain) for tx in $TX_SIZES; do drain "$tx"; done ;;
    steady)
      if [[ $STEADY_VARIANTS == first ]]; then steady 0
      else for k in "${!variants[@]}"; do steady "$k"; done
      fi ;;
    bigtx)
      for (( r = 1; r <= BIGTX_RUNS; r++ )); do
        for mode in "${bigtx_modes[@]}"; do
          if [[ $mode == off ]]; then bigtx "$r" off 0; else bigtx "$r" on 1; fi
        done
      done ;;
  esac
done

bench report "$run" "$OUT/$REPORT.json" "$OUT/$REPORT.png"
log "results: $OUT/$REPORT.json"
