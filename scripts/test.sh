#!/usr/bin/env bash
# The test command: brings the test servers up (scripts/env.sh up), runs
# `cargo test --all-targets` and `cargo test --doc` against them, and brings the
# servers down again however the tests end. Exits with the tests' status.
#
# If the servers were already running before this script started (a developer's
# own `scripts/env.sh up`), they are left running afterwards.
# Extra arguments go to both cargo test runs, e.g. `scripts/test.sh -- --nocapture`.
#
# The tests are built with the cargo features in OUTBOX_CDC_TEST_FEATURES
# (default `failpoints`: tests/chaos.rs needs the crash points compiled in; they
# stay inert unless OUTBOX_CDC_FAILPOINT arms one, so every other test sees the
# connector as shipped). Both runs use the same features so nothing is rebuilt.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd -P)"

was_up=0
if scripts/env.sh status >/dev/null 2>&1; then was_up=1; fi

# Process group of the cargo run in progress (see run_cargo).
cargo_group=""

# Ends whatever a cargo run left in its process group: a connector child that a
# failing test did not reap would otherwise live on after the tests.
end_group() {
    local group="$1" i
    [[ -n "$group" ]] || return 0
    kill -TERM -- "-$group" 2>/dev/null || return 0
    for ((i = 0; i < 50; i++)); do
        kill -0 -- "-$group" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -KILL -- "-$group" 2>/dev/null || true
}

# shellcheck disable=SC2317 # invoked by the EXIT trap
teardown() {
    local rc=$?
    end_group "$cargo_group"
    if [[ "$was_up" == 0 ]]; then
        # Quiet unless it fails, so that the tests' summary stays the last output.
        if ! scripts/env.sh down >"$ROOT/target/env-down.log" 2>&1; then
            cat "$ROOT/target/env-down.log" >&2
            echo "test.sh: scripts/env.sh down failed (output above)" >&2
        fi
    fi
    exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

scripts/env.sh up
# shellcheck source=/dev/null
. target/env/test.env
export RUST_BACKTRACE=1

mkdir -p target
out="$ROOT/target/test-output.log"
: >"$out"

# run_cargo ARGS...: `cargo ARGS` in a process group of its own, its output
# appended to $out and shown as it comes. The output goes to a file, not a pipe:
# a process a test leaked would hold a pipe open and stall the script.
run_cargo() {
    local part="$out.part" rc=0
    : >"$part"
    setsid -w cargo "$@" >>"$part" 2>&1 </dev/null &
    cargo_group=$!
    tail -n +1 -s 0.2 --pid="$cargo_group" -f "$part" || true
    wait "$cargo_group" || rc=$?
    end_group "$cargo_group"
    cargo_group=""
    cat "$part" >>"$out"
    rm -f "$part"
    return "$rc"
}

features="${OUTBOX_CDC_TEST_FEATURES-failpoints}"
status=0
run_cargo test --all-targets --no-fail-fast --features "$features" "$@" || status=$?
doc_status=0
run_cargo test --doc --features "$features" "$@" || doc_status=$?
if [[ "$status" == 0 ]]; then status=$doc_status; fi

# One closing line over every `test result:` line of both runs.
passed=0 failed=0
while read -r p f; do
    passed=$((passed + p))
    failed=$((failed + f))
done < <(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed;.*/\1 \2/p' "$out")
if [[ "$status" != 0 && "$failed" == 0 ]]; then
    echo "test.sh: cargo test exited with status $status without a failed test: a build error or a crashed test binary (see above)"
fi
echo "tests: $passed passed, $failed failed"
exit "$status"
