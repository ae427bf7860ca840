#!/usr/bin/env bash
# The test command: brings the test servers up (scripts/env.sh up), runs
# `cargo test --all-targets` and `cargo test --doc` against them, and brings the
# servers down again however the tests end. Exits with the tests' status.
#
# If the servers were already running before this script started (a developer's
# own `scripts/env.sh up`), they are left running afterwards.
# Extra arguments go to both cargo test runs, e.g. `scripts/test.sh -- --nocapture`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd -P)"

was_up=0
if scripts/env.sh status >/dev/null 2>&1; then was_up=1; fi

# shellcheck disable=SC2317 # invoked by the EXIT trap
teardown() {
    local rc=$?
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
status=0
cargo test --all-targets "$@" 2>&1 | tee "$out" || status=$?
doc_status=0
cargo test --doc "$@" 2>&1 | tee -a "$out" || doc_status=$?
if [[ "$status" == 0 ]]; then status=$doc_status; fi

# One closing line over every `test result:` line of both runs.
passed=0 failed=0
while read -r p f; do
    passed=$((passed + p))
    failed=$((failed + f))
done < <(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed;.*/\1 \2/p' "$out")
echo "tests: $passed passed, $failed failed"
exit "$status"
