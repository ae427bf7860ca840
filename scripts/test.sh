#!/usr/bin/env bash
# The test command: brings the test servers up (scripts/env.sh up), runs
# `cargo test --all-targets` and `cargo test --doc` against them (the full
# suite, on PostgreSQL 15), then the PostgreSQL version matrix: for each other
# major (13, 14, 16, 17, 18) the servers are brought up with that major and the
# core suite runs against it with the same test binaries (MATRIX_TESTS below; the
# chaos run with 10 cycles); from 16 on decoding from a standby
# (STANDBY_TESTS) and from 17 on the failover tests (FAILOVER_TESTS) then run,
# each on a fresh primary and standby (`scripts/env.sh up --standby`), since
# each stops or restarts a server. The servers are brought down again however the
# tests end. Exits with the tests' status; a major whose server cannot be
# started fails the run.
#
# If the servers were already running before this script started (a developer's
# own `scripts/env.sh up`), they are left running afterwards, and the matrix,
# which needs to replace them, is not run (the script says so).
# Extra arguments go to every cargo test run, e.g. `scripts/test.sh -- --nocapture`.
#
# OUTBOX_CDC_PG_VERSION picks the full suite's major (default 15);
# OUTBOX_CDC_TEST_PG_MATRIX lists the matrix's majors (default: the others of
# 13-18; `none` runs no matrix); OUTBOX_CDC_TEST_FULL=0 skips the full suite
# (e.g. `OUTBOX_CDC_TEST_FULL=0 OUTBOX_CDC_TEST_PG_MATRIX=17 scripts/test.sh`).
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
full_major="${OUTBOX_CDC_PG_VERSION:-15}"
# Each line of the closing summary: what ran, its outcome and wall time.
timings=()
status=0
if [[ "${OUTBOX_CDC_TEST_FULL:-1}" != 0 ]]; then
    t0=$SECONDS
    scripts/env.sh up
    # shellcheck source=/dev/null
    . target/env/test.env
    run_cargo test --all-targets --no-fail-fast --features "$features" "$@" || status=$?
    doc_status=0
    run_cargo test --doc --features "$features" "$@" || doc_status=$?
    if [[ "$status" == 0 ]]; then status=$doc_status; fi
    timings+=("PostgreSQL $full_major full suite: $([[ "$status" == 0 ]] && echo passed || echo FAILED) in $((SECONDS - t0))s")
fi

# The version matrix's core suite: the pipeline end to end (with the resume
# refusals), pgoutput decoded live, replication resume, the control SQL,
# `check`/`status` catalog queries, the partitioned outbox (no silent skip),
# version-dependent features, the server's major, and a 10-cycle chaos run.
# The first eight are modules of the shared test binary (tests/it), picked by
# name filter; server_shutdown and chaos are binaries of their own.
MATRIX_IT_MODULES=(env_servers pipeline pgoutput_live pg_replication pg_control operations
    no_silent_skip version_features)
MATRIX_TESTS=(server_shutdown chaos)
# Failover tests (not default cargo targets: they stop the primary), run per
# major from 17 on, each on a fresh `scripts/env.sh up --standby`.
FAILOVER_TESTS=(failover failover_unsynced)
# Decoding from a standby (16+): not a default cargo target either (it
# restarts the standby), run per major from 16 on a fresh pair.
STANDBY_TESTS=(standby_decoding)
matrix="${OUTBOX_CDC_TEST_PG_MATRIX-}"
if [[ -z "$matrix" ]]; then
    for m in 13 14 15 16 17 18; do
        if [[ "$m" != "$full_major" ]]; then matrix+="${matrix:+ }$m"; fi
    done
fi
if [[ "$matrix" == none ]]; then
    matrix=""
elif [[ "$was_up" == 1 ]]; then
    echo "test.sh: the PostgreSQL version matrix ($matrix) was NOT run: this checkout's servers were up" \
        "before test.sh started and the matrix replaces them; run \`scripts/env.sh down\` first to run it"
    matrix=""
fi
test_args=()
for t in "${MATRIX_TESTS[@]}"; do test_args+=(--test "$t"); done
it_filters=()
for m in "${MATRIX_IT_MODULES[@]}"; do it_filters+=("$m::"); done
for major in $matrix; do
    t0=$SECONDS
    echo "test.sh: PostgreSQL $major: core suite (${MATRIX_IT_MODULES[*]} ${MATRIX_TESTS[*]})"
    scripts/env.sh down >"$ROOT/target/env-down.log" 2>&1 || { cat "$ROOT/target/env-down.log" >&2; }
    if ! OUTBOX_CDC_PG_VERSION="$major" scripts/env.sh up; then
        echo "test.sh: PostgreSQL $major: scripts/env.sh up failed (output above): the core suite did not run"
        timings+=("PostgreSQL $major core suite: FAILED (the servers did not start)")
        status=1
        continue
    fi
    up=$((SECONDS - t0))
    # shellcheck source=/dev/null
    . target/env/test.env
    major_status=0
    export OUTBOX_CDC_SOAK_CYCLES=10 OUTBOX_CDC_CHAOS_EVERY_FAILPOINT=0
    run_cargo test --no-fail-fast --features "$features" --test it "$@" -- "${it_filters[@]}" || major_status=$?
    run_cargo test --no-fail-fast --features "$features" "${test_args[@]}" "$@" || major_status=$?
    unset OUTBOX_CDC_SOAK_CYCLES OUTBOX_CDC_CHAOS_EVERY_FAILPOINT
    if [[ "$major_status" != 0 ]]; then status=$major_status; fi
    timings+=("PostgreSQL $major core suite: $([[ "$major_status" == 0 ]] && echo passed || echo FAILED) in $((SECONDS - t0))s (servers up in ${up}s)")
    # With a standby (16+: decoding on a standby; 17+: failover slots): each
    # test stops or restarts a server, so each gets a fresh primary and standby.
    ha_tests=()
    if ((major >= 16)); then ha_tests+=(${STANDBY_TESTS[@]+"${STANDBY_TESTS[@]}"}); fi
    if ((major >= 17)); then ha_tests+=("${FAILOVER_TESTS[@]}"); fi
    if ((${#ha_tests[@]} > 0)); then
        for t in "${ha_tests[@]}"; do
            t0=$SECONDS
            echo "test.sh: PostgreSQL $major: $t (primary and standby)"
            scripts/env.sh down >"$ROOT/target/env-down.log" 2>&1 || { cat "$ROOT/target/env-down.log" >&2; }
            ha_status=0
            if OUTBOX_CDC_PG_VERSION="$major" scripts/env.sh up --standby; then
                # shellcheck source=/dev/null
                . target/env/test.env
                run_cargo test --no-fail-fast --features "$features" --test "$t" "$@" || ha_status=$?
            else
                echo "test.sh: PostgreSQL $major: scripts/env.sh up --standby failed (output above)"
                ha_status=1
            fi
            if [[ "$ha_status" != 0 ]]; then status=$ha_status; fi
            timings+=("PostgreSQL $major $t: $([[ "$ha_status" == 0 ]] && echo passed || echo FAILED) in $((SECONDS - t0))s")
        done
    fi
done
# Each panic's first lines once more, at the end, where a short excerpt of the
# output (a CI summary) still shows why a test failed.
if grep -q "panicked at" "$out"; then
    echo "test.sh: panics, first lines of each:"
    grep -A2 "panicked at" "$out" | grep -v '^--$' | cut -c1-1200 | head -n 45
fi
for line in "${timings[@]}"; do echo "test.sh: $line"; done

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
