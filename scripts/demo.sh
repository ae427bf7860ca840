#!/usr/bin/env bash
# End-to-end demo on this machine: starts PostgreSQL and Kafka (scripts/env.sh),
# the connector, a writer that commits orders with outbox rows (and some
# rollbacks), and a Kafka consumer that prints every event it reads.
# Ctrl-C stops everything and brings the environment down.
#
#   scripts/demo.sh            # runs until Ctrl-C
#   DEMO_SECONDS=30 scripts/demo.sh   # stops by itself after 30 s
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

was_up=0
if scripts/env.sh status >/dev/null 2>&1; then was_up=1; fi

pids=()
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "demo: stopping"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  # Servers that were running before the demo (a developer's own) stay up.
  if [[ "$was_up" == 0 ]]; then scripts/env.sh down || true; fi
}
trap cleanup INT TERM EXIT

scripts/env.sh up
# shellcheck disable=SC1091
. target/env/test.env

echo "demo: building the connector"
cargo build --quiet --bin outbox-cdc --example tail_events

mkdir -p target/demo
rm -rf target/demo/offsets
export OUTBOX_CDC__POSTGRES__URL="$OUTBOX_CDC_TEST_PG"
export OUTBOX_CDC__KAFKA__BOOTSTRAP_SERVERS="$OUTBOX_CDC_TEST_KAFKA"
export OUTBOX_CDC__OFFSETS__PATH="$root/target/demo/offsets"
export OUTBOX_CDC__HTTP__LISTEN="127.0.0.1:9187"
# The test broker does not auto-create topics (as in production): let the
# connector create outbox.event.order on first use (docs/operations.md, "Topics").
export OUTBOX_CDC__TOPICS__CREATE=true

target/debug/outbox-cdc run --config config/example.toml 2> target/demo/connector.log &
pids+=($!)
# Changes made before the slot exists are not in it: wait until the connector streams.
for _ in $(seq 1 120); do
  if curl -fsS http://127.0.0.1:9187/readyz >/dev/null 2>&1; then break; fi
  if ! kill -0 "${pids[0]}" 2>/dev/null; then
    echo "demo: the connector exited; its log:" >&2
    tail -20 target/demo/connector.log >&2
    exit 1
  fi
  sleep 0.5
done
echo "demo: connector streaming (log: target/demo/connector.log, metrics: http://127.0.0.1:9187/metrics)"

target/debug/examples/tail_events "$OUTBOX_CDC_TEST_KAFKA" &
pids+=($!)

(
  n=0
  while true; do
    n=$((n + 1))
    order="order-$(( (n - 1) % 5 + 1 ))"
    if (( n % 7 == 0 )); then outcome=ROLLBACK; else outcome=COMMIT; fi
    psql -q -X "$OUTBOX_CDC_TEST_PG_ADMIN" -v ON_ERROR_STOP=1 >/dev/null <<SQL
BEGIN;
INSERT INTO orders (order_id, customer, amount_cents)
  VALUES ('$order-$n', 'customer-$n', $((n * 100)));
SELECT outbox_emit('order', '$order', 'OrderPlaced',
  jsonb_build_object('order_id', '$order-$n', 'amount_cents', $((n * 100)), 'outcome', '$outcome'));
$outcome;
SQL
    sleep 1
  done
) &
pids+=($!)
echo "demo: writer committing one order per second (every 7th is rolled back and must never appear)"

if [[ -n "${DEMO_SECONDS:-}" ]]; then
  sleep "$DEMO_SECONDS"
else
  wait "${pids[0]}"
fi
