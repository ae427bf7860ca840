# shellcheck shell=bash
# shellcheck disable=SC2153 # STANDBY_LOG and STANDBY_DATA are set by pg_paths (pg.sh)
# Sourced by scripts/env.sh after common.sh and pg.sh: the standby (standby_*).

# A streaming physical standby of the primary, made by `up --standby`: from a
# copy of the cleanly stopped primary's data directory (the npm servers have no
# pg_basebackup), with a physical slot on the primary, hot_standby_feedback and,
# on 17+, slot synchronisation (sync_replication_slots on the standby,
# synchronized_standby_slots on the primary). It shares the primary's socket
# directory and PG_HOME (pg-standby/, pg-standby.log).

STANDBY_SLOT=outbox_cdc_standby

standby_made() { [[ -e "$ENV_DIR/standby.made" && -s "$STANDBY_DATA/PG_VERSION" ]]; }

standby_running() { [[ -n "$(pg_pid "$STANDBY_DATA")" ]]; }

standby_psql() { # standby_psql DB [psql args...]: as postgres over the unix socket
    local db="$1"
    shift
    "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$PG_SOCK" -p "$STANDBY_PORT" -U postgres -d "$db" "$@"
}

standby_make() {
    pg_paths
    if standby_made; then return 0; fi
    if port_open "$STANDBY_PORT"; then
        die "port $STANDBY_PORT (the standby's) is taken by $(port_owner "$STANDBY_PORT"); pick another with OUTBOX_CDC_PG_STANDBY_PORT (\`scripts/env.sh down\` first) and rerun"
    fi
    log "making a standby of PostgreSQL $PG_MAJOR on 127.0.0.1:$STANDBY_PORT (data $STANDBY_DATA)"
    rm -rf "$STANDBY_DATA"
    pg_psql postgres -c "SELECT pg_create_physical_replication_slot('$STANDBY_SLOT', true)
        WHERE NOT EXISTS (SELECT FROM pg_replication_slots WHERE slot_name = '$STANDBY_SLOT')" >/dev/null
    if ((PG_MAJOR >= 17)); then
        # Logical walsenders send no change the standby has not confirmed, so a
        # failover slot synced to it is never behind what a consumer received.
        cat >>"$PG_DATA/postgresql.conf" <<EOF

# ---- primary of a standby (scripts/env.sh up --standby) ----
synchronized_standby_slots = '$STANDBY_SLOT'
EOF
    fi
    # A clean stop: the copy then starts from the shutdown checkpoint.
    local pid
    pid="$(pg_pid)"
    if [[ -n "$pid" ]]; then
        log "stopping the primary (pid $pid) to copy its data directory"
        as_postgres "$PG_SERVER_BIN/pg_ctl" stop -D "$PG_DATA" -m fast -w -t 60 >/dev/null ||
            die "the primary did not stop cleanly; see $PG_LOG, then \`scripts/env.sh down && scripts/env.sh up --standby\`"
    fi
    cp -a "$PG_DATA" "$STANDBY_DATA"
    # As pg_basebackup does: no slots, pid files or options of the primary.
    find "$STANDBY_DATA/pg_replslot" -mindepth 1 -delete
    rm -f "$STANDBY_DATA/postmaster.pid" "$STANDBY_DATA/postmaster.opts"
    cat >>"$STANDBY_DATA/postgresql.conf" <<EOF

# ---- standby (scripts/env.sh up --standby) ----
port = $STANDBY_PORT
primary_conninfo = 'host=127.0.0.1 port=$PG_PORT user=postgres password=postgres dbname=app application_name=$STANDBY_SLOT'
primary_slot_name = '$STANDBY_SLOT'
hot_standby = on
hot_standby_feedback = on
EOF
    if ((PG_MAJOR >= 17)); then
        printf "sync_replication_slots = on\nsynchronized_standby_slots = ''\n" >>"$STANDBY_DATA/postgresql.conf"
    fi
    : >"$STANDBY_DATA/standby.signal"
    : >"$STANDBY_LOG"
    chown postgres: "$STANDBY_DATA/standby.signal" "$STANDBY_LOG"
    : >"$ENV_DIR/standby.made"
    pg_start
    pg_wait_ready
}

standby_start() {
    pg_paths
    standby_made || return 0
    if standby_running; then return 0; fi
    rm -f "$STANDBY_DATA/postmaster.pid"
    if port_open "$STANDBY_PORT"; then
        die "port $STANDBY_PORT (the standby's) is taken by $(port_owner "$STANDBY_PORT"); stop it and rerun"
    fi
    log "starting the standby on 127.0.0.1:$STANDBY_PORT"
    if ! as_postgres "$PG_SERVER_BIN/pg_ctl" start -D "$STANDBY_DATA" -l "$STANDBY_LOG" -w -t "$TIMEOUT" >/dev/null 9>&-; then
        tail_log "$STANDBY_LOG"
        die "the standby did not start within ${TIMEOUT}s (log above); \`scripts/env.sh down && scripts/env.sh up --standby\`"
    fi
}

# Until the primary reports the standby streaming (a promoted standby is a
# primary of its own: nothing to wait for).
standby_wait_streaming() {
    pg_paths
    standby_made && [[ ! -e "$ENV_DIR/standby.promoted" ]] || return 0
    local deadline=$((SECONDS + TIMEOUT))
    until [[ "$(pg_psql postgres -At -c "SELECT count(*) FROM pg_stat_replication
            WHERE application_name = '$STANDBY_SLOT' AND state = 'streaming'" 2>/dev/null)" == 1 ]]; do
        if ((SECONDS >= deadline)); then
            tail_log "$STANDBY_LOG"
            die "the standby did not stream from the primary within ${TIMEOUT}s (log above); \`scripts/env.sh down && scripts/env.sh up --standby\`"
        fi
        sleep 0.5
    done
}

standby_stop() {
    [[ -d "$ENV_DIR" ]] || return 0
    pg_paths
    local pid
    pid="$(pg_pid "$STANDBY_DATA")"
    if [[ -z "$pid" ]]; then return 0; fi
    log "stopping the standby (pid $pid)"
    if ! as_postgres "$PG_SERVER_BIN/pg_ctl" stop -D "$STANDBY_DATA" -m fast -w -t 60 >/dev/null 2>&1; then
        as_postgres "$PG_SERVER_BIN/pg_ctl" stop -D "$STANDBY_DATA" -m immediate -w -t 30 >/dev/null 2>&1 || true
    fi
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null || true
        sleep 1
    fi
}

standby_promote() {
    pg_paths
    standby_made || die "there is no standby; \`scripts/env.sh up --standby\` makes one"
    standby_running || die "the standby is not running; \`scripts/env.sh up --standby\` starts it"
    log "promoting the standby on 127.0.0.1:$STANDBY_PORT"
    as_postgres "$PG_SERVER_BIN/pg_ctl" promote -D "$STANDBY_DATA" -w -t "$TIMEOUT" >/dev/null ||
        { tail_log "$STANDBY_LOG"; die "the standby was not promoted within ${TIMEOUT}s (log above)"; }
    local deadline=$((SECONDS + TIMEOUT))
    until [[ "$(standby_psql postgres -At -c 'SELECT pg_is_in_recovery()' 2>/dev/null)" == f ]]; do
        ((SECONDS < deadline)) || die "the promoted standby still reports recovery after ${TIMEOUT}s; see $STANDBY_LOG"
        sleep 0.2
    done
    : >"$ENV_DIR/standby.promoted"
}

# The standby's line of `status`, if there is a standby.
standby_status() {
    [[ -d "$ENV_DIR" ]] || return 0
    pg_paths
    standby_made || return 0
    local pid what=standby
    pid="$(pg_pid "$STANDBY_DATA")"
    if [[ -e "$ENV_DIR/standby.promoted" ]]; then what="standby (promoted)"; fi
    if [[ -n "$pid" ]]; then
        echo "$what: running (pid $pid, 127.0.0.1:$STANDBY_PORT, data $STANDBY_DATA)"
    else
        echo "$what: stopped"
    fi
}
