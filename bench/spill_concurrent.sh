#!/usr/bin/env bash
# Many streamed transactions open at once (issue 50 F1): 100 writers each hold
# a transaction of 5 x 500 rows of ~2 kB (about 5 MB; the payload is random hex,
# so TOAST does not shrink it) open for about 5 s, 95 commit and 5 roll back.
# The server streams them all (pg_stat_replication_slots.stream_txns); the
# connector under test publishes the 237,500 committed rows. Prints its peak
# RSS (VmHWM), the most file descriptors it had open, the most streamed
# transactions its spill held and the memory it reported for them.
#
#   bench/spill_concurrent.sh [BIN] [LABEL]   # BIN: target/release/outbox-cdc
#
# Against the servers of scripts/env.sh (target/env/test.env); uses the
# publication outbox_pub on public.outbox_events (emptied first), a slot and a
# topic of its own, removed at the end. Needs curl and psql (PostgreSQL 15
# client binaries, or OUTBOX_CDC_PG_BIN).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
BIN=${1:-$root/target/release/outbox-cdc}
LABEL=${2:-run}
[[ -x $BIN ]] || { echo "spill_concurrent: $BIN not found (cargo build --release)" >&2; exit 2; }
# shellcheck source=/dev/null
source "$root/target/env/test.env"
ADMIN=$OUTBOX_CDC_TEST_PG_ADMIN
PSQL=${OUTBOX_CDC_PG_BIN:-/usr/lib/postgresql/15/bin}/psql
SLOT=spillexp_${LABEL}_$$
DIR=$(mktemp -d)
PORT=$((21000 + RANDOM % 1000))
"$PSQL" -X -q "$ADMIN" -c "TRUNCATE public.outbox_events" >/dev/null
OUTBOX_CDC__POSTGRES__URL="$OUTBOX_CDC_TEST_PG" OUTBOX_CDC__POSTGRES__SLOT=$SLOT \
OUTBOX_CDC__POSTGRES__PUBLICATION=outbox_pub OUTBOX_CDC__KAFKA__BOOTSTRAP_SERVERS="$OUTBOX_CDC_TEST_KAFKA" \
OUTBOX_CDC__OUTBOX__TOPIC="spillexp.$LABEL.$$" OUTBOX_CDC__TOPICS__CREATE=true \
OUTBOX_CDC__TOPICS__REPLICATION_FACTOR=1 OUTBOX_CDC__OFFSETS__PATH="$DIR/offsets" \
OUTBOX_CDC__HTTP__LISTEN=127.0.0.1:$PORT RUST_LOG=warn \
  "$BIN" run --config config/example.toml >"$DIR/connector.log" 2>&1 &
CPID=$!
cleanup() {
  kill "$CPID" 2>/dev/null || true
  sleep 2
  "$PSQL" -X -q "$ADMIN" -c "SELECT pg_drop_replication_slot('$SLOT')" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
for _ in $(seq 1 150); do
  curl -s "127.0.0.1:$PORT/metrics" | grep -q '^outbox_cdc_connected 1' && break
  sleep 0.2
done
( while kill -0 "$CPID" 2>/dev/null; do ls "/proc/$CPID/fd" 2>/dev/null | wc -l; sleep 0.1; done ) >"$DIR/fds.txt" &
( while kill -0 "$CPID" 2>/dev/null; do
    curl -s "127.0.0.1:$PORT/metrics" |
      awk '/^outbox_cdc_spill_transactions / {t=$2} /^outbox_cdc_spill_memory_bytes / {m=$2} END {print t+0, m+0}'
    sleep 0.2
  done ) >"$DIR/spill.txt" &
writers=()
for w in $(seq 1 100); do
  end=COMMIT
  (( w % 20 == 0 )) && end=ROLLBACK
  ( echo "BEGIN;"
    for step in 1 2 3 4 5; do
      echo "INSERT INTO public.outbox_events (event_id, aggregate_type, aggregate_id, aggregate_sequence, event_type, payload)
            SELECT gen_random_uuid(), 'spill', 'w$w', ($step - 1) * 500 + g, 'E',
                   jsonb_build_object('pad', (SELECT string_agg(md5(random()::text || x::text), '')
                                              FROM generate_series(1, 64) x WHERE g > 0))
            FROM generate_series(1, 500) g;"
      echo "SELECT pg_sleep(1);"
    done
    echo "$end;" ) | "$PSQL" -X -q "$ADMIN" >/dev/null &
  writers+=($!)
done
wait "${writers[@]}"
pub=0
for _ in $(seq 1 1200); do
  pub=$(curl -s "127.0.0.1:$PORT/metrics" | awk '/^outbox_cdc_events_published_total/ {print int($2)}')
  (( ${pub:-0} >= 237500 )) && break
  sleep 0.5
done
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$CPID/status")
maxfd=$(sort -n "$DIR/fds.txt" | tail -1)
maxtx=$(awk '{print $1}' "$DIR/spill.txt" | sort -n | tail -1)
maxmem=$(awk '{print $2}' "$DIR/spill.txt" | sort -g | tail -1)
stream=$("$PSQL" -X -At "$ADMIN" -c "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = '$SLOT'")
echo "spill_concurrent [$LABEL]: published $pub of 237500; peak RSS $((hwm / 1024)) MiB; at most $maxfd open files;" \
  "spill at most $maxtx transactions, $maxmem bytes reported; the server streamed $stream transactions"
(( ${pub:-0} >= 237500 ))
