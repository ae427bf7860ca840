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
# which needs to replace them, is not run (a NOT RUN line, below); servers up
# with another major than the full suite's make it fail instead of running there.
# Extra arguments go to every cargo test run, e.g. `scripts/test.sh -- --nocapture`.
#
# OUTBOX_CDC_PG_VERSION picks the full suite's major (default 15);
# OUTBOX_CDC_TEST_PG_MATRIX lists the matrix's majors (default: the others of
# 13-18; `none` runs no matrix); OUTBOX_CDC_TEST_FULL=0 skips the full suite
# (e.g. `OUTBOX_CDC_TEST_FULL=0 OUTBOX_CDC_TEST_PG_MATRIX=17 scripts/test.sh`).
#
# The tests are built with the cargo features in OUTBOX_CDC_TEST_FEATURES
# (default `failpoints`: tests/chaos needs the crash points compiled in; they
# stay inert unless OUTBOX_CDC_FAILPOINT arms one, so every other test sees the
# connector as shipped). Both runs use the same features so nothing is rebuilt.
#
# The script never passes having run less than it says. Whatever leaves part of
# the suite out is said at once and again among the closing lines, each as
# `test.sh: NOT RUN: ...`: servers that were up before it started (no matrix),
# an inherited OUTBOX_CDC_TEST_FULL=0 or OUTBOX_CDC_TEST_PG_MATRIX (any value,
# `none` included), OUTBOX_CDC_TEST_FEATURES without `failpoints` (cargo then
# leaves out the test binaries that require it). Outside CI these are the
# developer's choices; with CI=true (set by .ci/run) the script refuses them:
# it runs nothing and exits 1. These fail the run everywhere: a test filter of
# the matrix (MATRIX_IT_MODULES, MATRIX_TESTS, STANDBY_TESTS, FAILOVER_TESTS)
# that names no test of its binary (checked with `--list` before the matrix and
# in each run's output), and a cargo test run that printed no `test result:`
# line. The closing line stays
# `tests: N passed, M failed` (CI reads it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd -P)"

in_ci=0
case "${CI:-}" in true | TRUE | True | 1) in_ci=1 ;; esac

was_up=0
if scripts/env.sh status >/dev/null 2>&1; then was_up=1; fi

# What this run leaves out of the whole suite, said when found and again among
# the closing lines: `reduced` by the environment (fails the run under CI),
# `missing` by a defect of the script, the tests or the build (always fails it).
reduced=()
missing=()
not_run() { # not_run reduced|missing TEXT
    local kind="$1"
    shift
    if [[ "$kind" == reduced ]]; then reduced+=("$*"); else missing+=("$*"); fi
    echo "test.sh: NOT RUN: $*"
}

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

# The output of the last cargo run alone (see run_cargo).
last="$ROOT/target/test-output.last.log"
# The last non-zero exit status of a cargo run (0: none failed).
cargo_rc=0

# run_cargo ARGS...: `cargo ARGS` in a process group of its own, its output
# appended to $out and shown as it comes. The output goes to a file, not a pipe:
# a process a test leaked would hold a pipe open and stall the script. A run
# that prints no `test result:` line ran no test: that fails it.
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
    mv -f "$part" "$last"
    if [[ "$rc" != 0 ]]; then cargo_rc=$rc; fi
    if ! grep -q '^test result: ' "$last"; then
        not_run missing "\`cargo $*\` printed no \`test result:\` line, so no test of it ran (exit status $rc)"
        if [[ "$rc" == 0 ]]; then rc=1; fi
    fi
    return "$rc"
}

# The extra arguments meant for cargo itself (those before a `--`).
cargo_args=()
for a in "$@"; do
    if [[ "$a" == -- ]]; then break; fi
    cargo_args+=("$a")
done

# A test filter is "BINARY FILTER": the tests of tests/BINARY whose names
# contain FILTER (libtest's name filter, e.g. `server_shutdown::` for a module).

# check_filters SPEC...: `cargo test --test BINARY -- --list` for each binary
# named; each filter must name at least one of its tests (a renamed module
# would otherwise run nothing in every major, and pass).
check_filters() {
    local spec bin filter list tests rc=0
    local -A listed=()
    echo "test.sh: checking that each test filter of the matrix names a test (cargo test --test BINARY -- --list)"
    for spec in "$@"; do
        read -r bin filter <<<"$spec"
        list="$ROOT/target/$bin-tests.list"
        if [[ -z "${listed[$bin]+set}" ]]; then
            listed[$bin]=1
            if ! cargo test ${cargo_args[@]+"${cargo_args[@]}"} --features "$features" --test "$bin" -- --list >"$list" </dev/null; then
                not_run missing "the version matrix's tests of tests/$bin: \`cargo test --test $bin -- --list\` failed (output above)"
                rc=1
                continue
            fi
        fi
        [[ -s "$list" ]] || continue
        tests="$(sed -n 's/: test$//p' "$list")"
        if ! grep -qF -- "$filter" <<<"$tests"; then
            not_run missing "test filter '$filter' of tests/$bin (scripts/test.sh) names no test of it: renamed or removed?"
            rc=1
        fi
    done
    return "$rc"
}

# check_ran WHAT FILTER...: in the output of the last run (WHAT, e.g.
# "PostgreSQL 17: tests/it core suite"), at least one test of each filter ran.
check_ran() {
    local what="$1" names f total=0 p f2 rc=0
    shift
    while read -r p f2; do total=$((total + p + f2)); done < <(
        sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed;.*/\1 \2/p' "$last")
    if [[ "$total" == 0 ]]; then
        not_run missing "$what ran no test (filters: $*)"
        return 1
    fi
    # `test NAME ... ok|FAILED|ignored`: the ignored ones did not run.
    names="$(sed -n 's/^test \([^ ]*\) \.\.\. .*/\1/p' "$last" | sort -u)"
    names="$(comm -23 <(printf '%s\n' "$names") <(sed -n 's/^test \([^ ]*\) \.\.\. ignored.*/\1/p' "$last" | sort -u))"
    if [[ -z "$names" ]]; then
        echo "test.sh: $what: the output names no test (a quiet format?); each filter was checked by --list only"
        return 0
    fi
    for f in "$@"; do
        if ! grep -qF -- "$f" <<<"$names"; then
            not_run missing "$what: no test of filter '$f' ran"
            rc=1
        fi
    done
    return "$rc"
}

# run_filtered WHAT SPEC [CARGO ARGS...]: the tests of one filter
# ("BINARY FILTER"), then check_ran.
run_filtered() {
    local what="$1" bin filter rc=0
    read -r bin filter <<<"$2"
    shift 2
    run_cargo test --no-fail-fast --features "$features" --test "$bin" "$@" -- "$filter" || rc=$?
    check_ran "$what" "$filter" || { if [[ "$rc" == 0 ]]; then rc=1; fi; }
    return "$rc"
}

features="${OUTBOX_CDC_TEST_FEATURES-failpoints}"
full_major="${OUTBOX_CDC_PG_VERSION:-15}"
run_full=1
if [[ "${OUTBOX_CDC_TEST_FULL:-1}" == 0 ]]; then run_full=0; fi

# The version matrix's core suite: the pipeline end to end (with the resume
# refusals), pgoutput decoded live, replication resume, the control SQL,
# `check`/`status` catalog queries, the partitioned outbox (no silent skip),
# version-dependent features, the server's major, large transactions (streamed
# from 14 on, whole on 13), a server restart under streaming, and a 10-cycle
# chaos run. The first ten are modules of the
# shared test binary (tests/it), picked by name filter, in one run; the last
# two are test filters ("BINARY FILTER") of tests/disruptive and tests/chaos,
# a run each.
MATRIX_IT_MODULES=(env_servers pipeline pgoutput_live pg_replication pg_control operations
    no_silent_skip coverage_break version_features large_transactions witness)
MATRIX_TESTS=("disruptive server_shutdown::" "chaos at_least_once::")
# Failover tests (tests/standby, not a default cargo target: they stop the
# primary), run per major from 17 on, each on a fresh `scripts/env.sh up --standby`.
FAILOVER_TESTS=("standby failover::" "standby failover_unsynced::")
# Decoding from a standby (16+, tests/standby too: it restarts the standby),
# run per major from 16 on a fresh pair.
STANDBY_TESTS=("standby standby_decoding::")
default_matrix=""
for m in 13 14 15 16 17 18; do
    if [[ "$m" != "$full_major" ]]; then default_matrix+="${default_matrix:+ }$m"; fi
done
matrix="${OUTBOX_CDC_TEST_PG_MATRIX-}"
if [[ -z "$matrix" ]]; then matrix="$default_matrix"; fi
if [[ "$matrix" == none ]]; then matrix=""; fi

# What the environment leaves out (see the top).
if [[ "$run_full" == 0 ]]; then
    not_run reduced "the full suite on PostgreSQL $full_major (cargo test --all-targets, --doc):" \
        "OUTBOX_CDC_TEST_FULL=0 is set"
fi
if [[ -n "${OUTBOX_CDC_TEST_PG_MATRIX+set}" ]]; then
    left_out=""
    for m in $default_matrix; do
        if [[ " $matrix " != *" $m "* ]]; then left_out+="${left_out:+ }$m"; fi
    done
    not_run reduced "the default PostgreSQL version matrix ($default_matrix):" \
        "OUTBOX_CDC_TEST_PG_MATRIX='$OUTBOX_CDC_TEST_PG_MATRIX' is set (runs: ${matrix:-no major}; left out: ${left_out:-none})"
fi
if [[ ",${features//[[:space:]]/,}," != *,failpoints,* ]]; then
    # The [[test]] targets of Cargo.toml with required-features = ["failpoints"].
    needs_failpoints="$(awk '
        /^\[\[test\]\]/ { in_test = 1; name = ""; next }
        /^\[/ { in_test = 0 }
        in_test && /^name *=/ { name = $0; sub(/^name *= *"/, "", name); sub(/".*/, "", name) }
        in_test && /^required-features *=.*"failpoints"/ && name != "" { print name }' Cargo.toml | xargs)"
    # The test files that keep some tests behind #[cfg(feature = "failpoints")].
    gated_tests="$(grep -rlF --include='*.rs' '#[cfg(feature = "failpoints")]' tests | sort | xargs)"
    not_run reduced "the test binaries that require the failpoints feature (${needs_failpoints:-see Cargo.toml})," \
        "the tests behind #[cfg(feature = \"failpoints\")] (in ${gated_tests:-no file})" \
        "and the matrix's chaos run: OUTBOX_CDC_TEST_FEATURES='$features' lacks failpoints"
    kept=()
    for t in "${MATRIX_TESTS[@]}"; do
        if [[ " $needs_failpoints " != *" ${t%% *} "* ]]; then kept+=("$t"); fi
    done
    MATRIX_TESTS=(${kept[@]+"${kept[@]}"})
fi
if [[ -n "$matrix" && "$was_up" == 1 ]]; then
    not_run reduced "the PostgreSQL version matrix ($matrix: core suite; standby decoding on 16+, failover on 17+):" \
        "this checkout's servers were up before test.sh started and the matrix replaces them;" \
        "run \`scripts/env.sh down\` first to run it"
    matrix=""
fi
if [[ "$in_ci" == 1 && ${#reduced[@]} -gt 0 ]]; then
    echo "test.sh: CI=true: refusing to run less than the whole suite (the NOT RUN lines above): nothing runs"
    run_full=0
    matrix=""
fi

# Each line of the closing summary: what ran, its outcome and wall time.
timings=()
status=0
if [[ "$run_full" == 1 ]]; then
    t0=$SECONDS
    # The major asked for: servers that were up with another one make
    # `scripts/env.sh up` refuse instead of running the suite on that one.
    if OUTBOX_CDC_PG_VERSION="$full_major" scripts/env.sh up; then
        # shellcheck source=/dev/null
        . target/env/test.env
        run_cargo test --all-targets --no-fail-fast --features "$features" "$@" || status=$?
        doc_status=0
        run_cargo test --doc --features "$features" "$@" || doc_status=$?
        if [[ "$status" == 0 ]]; then status=$doc_status; fi
        timings+=("PostgreSQL $full_major full suite: $([[ "$status" == 0 ]] && echo passed || echo FAILED) in $((SECONDS - t0))s")
    else
        not_run missing "the full suite on PostgreSQL $full_major: scripts/env.sh up failed (output above)"
        timings+=("PostgreSQL $full_major full suite: FAILED (the servers did not start)")
        status=1
    fi
fi

it_filters=()
for m in "${MATRIX_IT_MODULES[@]}"; do it_filters+=("$m::"); done
if [[ -n "$matrix" ]]; then
    all_filters=()
    for f in "${it_filters[@]}"; do all_filters+=("it $f"); done
    check_filters "${all_filters[@]}" ${MATRIX_TESTS[@]+"${MATRIX_TESTS[@]}"} \
        "${STANDBY_TESTS[@]}" "${FAILOVER_TESTS[@]}" || status=1
fi
for major in $matrix; do
    t0=$SECONDS
    echo "test.sh: PostgreSQL $major: core suite (${MATRIX_IT_MODULES[*]}; ${MATRIX_TESTS[*]-})"
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
    it_status=0
    run_cargo test --no-fail-fast --features "$features" --test it "$@" -- "${it_filters[@]}" || it_status=$?
    check_ran "PostgreSQL $major: the tests/it core suite" "${it_filters[@]}" ||
        { if [[ "$it_status" == 0 ]]; then it_status=1; fi; }
    if [[ "$it_status" != 0 ]]; then major_status=$it_status; fi
    for t in ${MATRIX_TESTS[@]+"${MATRIX_TESTS[@]}"}; do
        run_filtered "PostgreSQL $major: tests/$t" "$t" "$@" || major_status=$?
    done
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
            name="${t#* }"
            name="${name%::}"
            echo "test.sh: PostgreSQL $major: $name (primary and standby; tests/$t)"
            scripts/env.sh down >"$ROOT/target/env-down.log" 2>&1 || { cat "$ROOT/target/env-down.log" >&2; }
            ha_status=0
            if OUTBOX_CDC_PG_VERSION="$major" scripts/env.sh up --standby; then
                # shellcheck source=/dev/null
                . target/env/test.env
                run_filtered "PostgreSQL $major: tests/$t" "$t" "$@" || ha_status=$?
            else
                echo "test.sh: PostgreSQL $major: scripts/env.sh up --standby failed (output above)"
                ha_status=1
            fi
            if [[ "$ha_status" != 0 ]]; then status=$ha_status; fi
            timings+=("PostgreSQL $major $name: $([[ "$ha_status" == 0 ]] && echo passed || echo FAILED) in $((SECONDS - t0))s")
        done
    fi
done
# Each panic's first lines once more, at the end, where a short excerpt of the
# output (a CI summary) still shows why a test failed.
if grep -q "panicked at" "$out"; then
    echo "test.sh: panics, first lines of each:"
    # sed, not head: head's early exit would end cut with SIGPIPE, which
    # pipefail and set -e turn into an exit before the closing line.
    grep -A2 "panicked at" "$out" | grep -v '^--$' | cut -c1-1200 | sed -n '1,45p'
fi
for line in "${timings[@]}"; do echo "test.sh: $line"; done
if (($# > 0)); then echo "test.sh: extra cargo test arguments (every run): $*"; fi
# What did not run, once more where a CI summary shows it.
for line in "${reduced[@]}" "${missing[@]}"; do echo "test.sh: NOT RUN: $line"; done
if ((${#reduced[@]} > 0)); then
    if [[ "$in_ci" == 1 ]]; then
        echo "test.sh: FAILED: CI=true and the environment leaves part of the suite out (NOT RUN above)"
        status=1
    else
        echo "test.sh: outside CI, what the environment leaves out (NOT RUN above) is its choice; with CI=true it fails the run"
    fi
fi
if ((${#missing[@]} > 0)) && [[ "$status" == 0 ]]; then status=1; fi

# One closing line over every `test result:` line of both runs.
passed=0 failed=0
while read -r p f; do
    passed=$((passed + p))
    failed=$((failed + f))
done < <(sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed;.*/\1 \2/p' "$out")
if [[ "$cargo_rc" != 0 && "$failed" == 0 ]]; then
    echo "test.sh: cargo test exited with status $cargo_rc without a failed test: a build error or a crashed test binary (see above)"
fi
echo "tests: $passed passed, $failed failed"
exit "$status"
