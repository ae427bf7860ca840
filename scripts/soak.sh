#!/usr/bin/env bash
# Soak run of the chaos harness (tests/chaos/at_least_once.rs, or with --mode
# exactly-once tests/chaos/exactly_once.rs): N kill/restart cycles of the
# connector and the reference consumer at every failpoint and at random
# moments, with Kafka stopped/started and PostgreSQL restarted on the way (once
# per 500 cycles, at least once), then the four invariants checked.
#
#   scripts/soak.sh --cycles N [--seed S] [--mode at-least-once|exactly-once]
#
# --mode picks the connector's [delivery] mode (default at-least-once) and sets
# OUTBOX_CDC_CHAOS_MODE. at-least-once runs `at_least_once::` of tests/chaos
# (a slot is lost and repaired once; duplicates must each follow a crash);
# exactly-once runs its `exactly_once::` (two more crash points around the
# Kafka commit, no slot loss, and duplicates must be 0 as read_committed reads).
#
# Brings the test environment up when it is not running, and down again
# afterwards in that case only. The full output goes to target/soak-<time>.log
# (and to stderr as it runs). The last line is exactly
#
#   soak: cycles=N events=E duplicates=D lost=L order_violations=V double_effects=X
#
# and the exit status is 0 only when the harness passed and lost,
# order_violations and double_effects are all 0 (and duplicates too with
# --mode exactly-once).
#
# Tunables passed through to the harness: OUTBOX_CDC_CHAOS_TX_PER_SEC,
# OUTBOX_CDC_CHAOS_WRITERS, OUTBOX_CDC_CHAOS_AGGREGATES.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd -P)"

usage() {
    sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

cycles=""
seed=""
mode="at-least-once"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --mode) mode="${2:-}"; shift 2 || usage ;;
        --mode=*) mode="${1#--mode=}"; shift ;;
        --cycles) cycles="${2:-}"; shift 2 || usage ;;
        --cycles=*) cycles="${1#--cycles=}"; shift ;;
        --seed) seed="${2:-}"; shift 2 || usage ;;
        --seed=*) seed="${1#--seed=}"; shift ;;
        -h | --help) usage ;;
        *) echo "soak.sh: unknown argument $1" >&2; usage ;;
    esac
done
[[ "$cycles" =~ ^[1-9][0-9]*$ ]] || { echo "soak.sh: --cycles needs a positive integer, got '${cycles}'" >&2; usage; }
[[ -z "$seed" || "$seed" =~ ^[0-9]+$ ]] || { echo "soak.sh: --seed needs a non-negative integer, got '$seed'" >&2; exit 2; }
case "$mode" in
    at-least-once) test_filter=at_least_once::; must_be_zero=(lost order_violations double_effects) ;;
    exactly-once) test_filter=exactly_once::; must_be_zero=(duplicates lost order_violations double_effects) ;;
    *) echo "soak.sh: --mode needs at-least-once or exactly-once, got '$mode'" >&2; exit 2 ;;
esac

mkdir -p target
log="$ROOT/target/soak-$(date +%Y%m%d-%H%M%S).log"
soak_line="soak: cycles=$cycles events=0 duplicates=0 lost=unknown order_violations=unknown double_effects=unknown"

was_up=0
if scripts/env.sh status >/dev/null 2>&1; then was_up=1; fi

# shellcheck disable=SC2317 # invoked by the EXIT trap
finish() {
    local rc=$?
    if [[ "$was_up" == 0 ]]; then
        scripts/env.sh down >"$ROOT/target/soak-env-down.log" 2>&1 ||
            echo "soak.sh: scripts/env.sh down failed (target/soak-env-down.log)" >&2
    fi
    echo "$soak_line"
    exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

scripts/env.sh up >&2
# shellcheck source=/dev/null
. target/env/test.env

status=0
env OUTBOX_CDC_SOAK_CYCLES="$cycles" OUTBOX_CDC_CHAOS_MODE="$mode" ${seed:+OUTBOX_CDC_CHAOS_SEED="$seed"} \
    cargo test --features failpoints --test chaos -- --nocapture "$test_filter" 2>&1 | tee "$log" >&2 || status=$?

found="$(grep -E '^soak: cycles=[0-9]+ ' "$log" | tail -n 1 || true)"
if [[ -z "$found" ]]; then
    echo "soak.sh: the harness ended before its verdict (exit $status); see $log" >&2
    exit 1
fi
soak_line="$found"
if [[ "$status" != 0 ]]; then
    echo "soak.sh: the harness failed (exit $status); see $log" >&2
    exit 1
fi
for key in "${must_be_zero[@]}"; do
    if [[ ! "$soak_line" =~ (^|\ )$key=0(\ |$) ]]; then
        echo "soak.sh: $key is not 0; see $log" >&2
        exit 1
    fi
done
echo "soak.sh: passed ($mode); output in $log" >&2
