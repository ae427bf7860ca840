# shellcheck shell=bash
# shellcheck disable=SC2034 # the settings are read by env.sh and the other pieces
# Sourced by scripts/env.sh (its header says what the commands do): what the
# servers share. The settings an environment is made with and keeps (ports,
# PostgreSQL major, Kafka version, the npm pins), log/die, port and package
# helpers, the prerequisites of both servers, target/env/test.env, the lock.
# The servers themselves are in pg.sh, standby.sh and kafka.sh beside it.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)"
ENV_DIR="$ROOT/target/env"
LOCK_FILE="$ROOT/target/.env.lock"
REPO_HASH="$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)"
TIMEOUT="${OUTBOX_CDC_ENV_TIMEOUT:-90}"

# Client tools (psql, pg_isready), for every major.
PG_BIN=/usr/lib/postgresql/15/bin
PG_PORT="${OUTBOX_CDC_PG_PORT:-54329}"
PG_MAJOR="${OUTBOX_CDC_PG_VERSION:-15}"
PG_DIST="${OUTBOX_CDC_PG_DIST:-/opt/outbox-cdc}"
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

KAFKA_VERSION="${OUTBOX_CDC_KAFKA_VERSION:-4.1.1}"
KAFKA_PORT="${OUTBOX_CDC_KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT="${OUTBOX_CDC_KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}"
CACHE_ROOT="${OUTBOX_CDC_CACHE:-${HOME:-/root}/.cache/outbox-cdc}"

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
# client certificate (their material: kafka.sh).
KAFKA_SSL_PORT=$((KAFKA_PORT + 2))
KAFKA_SASL_PORT=$((KAFKA_PORT + 3))
KAFKA_MTLS_PORT=$((KAFKA_PORT + 4))
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

# ---------------------------------------------------------------- lock

with_lock() {
    mkdir -p "$ROOT/target"
    exec 9>"$LOCK_FILE"
    flock -w 900 9 || die "another scripts/env.sh has held $LOCK_FILE for 15 minutes; check \`ps\` for it"
}
