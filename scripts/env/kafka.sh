# shellcheck shell=bash
# shellcheck disable=SC2153 # KAFKA_PORT and the other ports are common.sh's
# Sourced by scripts/env.sh after common.sh: the Kafka broker (kafka_*), its
# jars, configuration and TLS material.

KAFKA_JARS="$CACHE_ROOT/kafka-$KAFKA_VERSION"
KAFKA_CP="$KAFKA_JARS/*"
KAFKA_DIR="$ENV_DIR/kafka"
KAFKA_DATA="$ENV_DIR/kafka-data"
KAFKA_PID_FILE="$ENV_DIR/kafka.pid"
KAFKA_LOG="$ENV_DIR/kafka.log"
KAFKA_OUT="$ENV_DIR/kafka.out"
KAFKA_PROPS="$KAFKA_DIR/server.properties"

# The material of the secured listeners (their ports are in common.sh): the
# certificates (kafka_tls) and the SCRAM user (kafka_format), made by `up`.
KAFKA_TLS_DIR="$ENV_DIR/kafka-tls"
KAFKA_SCRAM_USER=outbox
KAFKA_SCRAM_PASSWORD=outbox-scram-secret

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

# For `up`, before anything is made: ports held by something else are not ours
# to free.
kafka_ports_free() {
    local p
    if ! kafka_running; then
        for p in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT" "$KAFKA_SSL_PORT" "$KAFKA_SASL_PORT" "$KAFKA_MTLS_PORT"; do
            if port_open "$p"; then
                die "port $p is taken by $(port_owner "$p"), not this checkout's test Kafka; stop it (or run \`scripts/env.sh down\` in the checkout that started it, or pick other ports with OUTBOX_CDC_KAFKA_PORT) and rerun"
            fi
        done
    fi
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

# The broker's line of `status`; fails if it does not run.
kafka_status() {
    local pid
    pid="$(kafka_pid)"
    if [[ -n "$pid" ]]; then
        echo "kafka: running (pid $pid, $KAFKA_BOOTSTRAP, data $KAFKA_DATA)"
    else
        echo "kafka: stopped"
        return 3
    fi
}
