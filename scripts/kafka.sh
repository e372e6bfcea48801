#!/usr/bin/env bash
# Apache Kafka (4.4.0, KRaft: no ZooKeeper) on 127.0.0.1 for the tests, the soak and local trials: the
# broker our users run, resolved from Maven Central with scripts/kafka/pom.xml (no tarball is served
# here) into $LACUNA_CACHE, every jar checked against scripts/kafka/jars.sha256.
#
# Usage: scripts/kafka.sh install|start|stop|restart|kill|resume|status|pid|transactions|groups|hanging
#        [--port N] [options]
#   install  resolves the jars (once: a second run checks the hashes and resolves nothing)
#   start    formats fresh KRaft storage and starts the cluster, then waits until it serves metadata
#            --nodes 1|3   one combined broker/controller (default), or three with static voters
#            --controller-port C   the single node's controller port (default N+1)
#            --secure [--users a,b]   one node over SASL_SSL with SCRAM-SHA-512 and the StandardAuthorizer
#                          (scripts/kafka/secure.sh): users admin (super) and a, b, passwords <user>-secret
#   stop     TERM every node by PID, KILL after 30 s; deletes the cluster's data, keeping each node's
#            server.log in $LACUNA_CACHE/run/kafka-N.logs/ (the last stopped cluster's)
#   restart  --node I [--crash]: stops node I (TERM; --crash: KILL, as a crash) and starts it again on
#            its data
#   kill     --node I: KILL node I and leave it down (its data stays); `resume --node I` starts it again
#   status   exit 0 when every node's broker port answers
#   pid      --node I: prints node I's PID
#   transactions  lists the transactional ids with their coordinator's node id (Kafka's
#            TransactionsCommand), for a test that kills the node coordinating a process's transactions
#   acls add|remove FILE   (--secure) adds or removes a table of ACLs, as `lacuna acls` prints it
#   groups   every consumer group's offsets and lag by partition; hanging: transactions open past
#            their timeout on each node (both read after a stalled test)
# Ports: a cluster is named by its first broker port N. Node I listens on N+2(I-1) (clients) and,
# for three nodes, N+2(I-1)+1 (its controller).
#
# Environment: LACUNA_CACHE [~/.cache/lacuna], LACUNA_KAFKA_PORT [19292], KAFKA_JAVA_HOME (a Java 17
# home; default the system's OpenJDK 17).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${LACUNA_CACHE:-$HOME/.cache/lacuna}"
VERSION=4.4.0
LIBS="$CACHE/kafka-$VERSION/libs"
PORT="${LACUNA_KAFKA_PORT:-19292}"
NODES=1
NODE=""
CONTROLLER_PORT=""
CRASH=0
SECURE=0
USERS=""
ARGS=()
CMD="${1:-}"; shift || true
while [ $# -gt 0 ]; do
    case "$1" in
        --port) PORT=$2; shift 2 ;;
        --nodes) NODES=$2; shift 2 ;;
        --node) NODE=$2; shift 2 ;;
        --controller-port) CONTROLLER_PORT=$2; shift 2 ;;
        --crash) CRASH=1; shift ;;
        --secure) SECURE=1; shift ;;
        --users) USERS=$2; shift 2 ;;
        --*) echo "kafka: unknown argument $1" >&2; exit 2 ;;
        *) ARGS+=("$1"); shift ;;
    esac
done
RUN="$CACHE/run/kafka-$PORT"
[ "${#ARGS[@]}" = 0 ] || [ "$CMD" = acls ] || { echo "kafka: unknown argument ${ARGS[0]}" >&2; exit 2; }

log() { echo "kafka: $*" >&2; }
die() { log "$*"; exit 1; }
# shellcheck source=kafka/secure.sh
. "$HERE/kafka/secure.sh"

# Java 17: Kafka 4.x runs on 17 and later, but the tests pin one (a Temurin 25 JDK is installed too).
java_home() {
    local home="${KAFKA_JAVA_HOME:-}"
    if [ -z "$home" ]; then
        for candidate in /usr/lib/jvm/java-17-openjdk-amd64 /usr/lib/jvm/java-17-openjdk /usr/lib/jvm/java-1.17.0-openjdk-amd64; do
            [ -x "$candidate/bin/java" ] && { home=$candidate; break; }
        done
    fi
    [ -n "$home" ] && [ -x "$home/bin/java" ] || die "no Java 17 found (apt-get install openjdk-17-jre-headless, or set KAFKA_JAVA_HOME)"
    "$home/bin/java" -version 2>&1 | grep -q 'version "17' || die "$home is not a Java 17 (set KAFKA_JAVA_HOME)"
    echo "$home"
}

# The jars that differ from their recorded hashes (or are missing), one name a line.
bad_jars() {
    local name want got
    while read -r want name; do
        if [ -f "$LIBS/$name" ]; then got=$(sha256sum "$LIBS/$name" | cut -d' ' -f1); else got=missing; fi
        [ "$got" = "$want" ] || echo "$name ($got, expected $want)"
    done < "$HERE/kafka/jars.sha256"
}

install() {
    [ -z "$(bad_jars)" ] && return 0
    command -v mvn > /dev/null || die "Maven (mvn) is needed to resolve org.apache.kafka:kafka_2.13:$VERSION"
    log "resolving org.apache.kafka:kafka_2.13:$VERSION and kafka-tools from Maven Central into $CACHE/m2"
    rm -rf "$LIBS"
    JAVA_HOME=$(java_home) mvn -q -B -f "$HERE/kafka/pom.xml" -Dmaven.repo.local="$CACHE/m2" \
        dependency:copy-dependencies -DoutputDirectory="$LIBS" >&2 ||
        die "could not resolve org.apache.kafka:kafka_2.13:$VERSION (scripts/kafka/pom.xml) from Maven Central; no other broker is used in its place"
    local bad; bad=$(bad_jars)
    [ -z "$bad" ] || die "jars that differ from scripts/kafka/jars.sha256 (refusing to run them):
$bad"
    local extra; extra=$(comm -13 <(cut -d' ' -f3 "$HERE/kafka/jars.sha256" | sort) <(ls "$LIBS" | sort))
    [ -z "$extra" ] || die "jars resolved that scripts/kafka/jars.sha256 does not record: $extra"
}

client_port() { echo $((PORT + 2 * ($1 - 1))); }
controller_port() {
    if [ "$NODES" = 1 ] && [ -n "$CONTROLLER_PORT" ]; then echo "$CONTROLLER_PORT"; else echo $(($(client_port "$1") + 1)); fi
}
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# The node count of a running cluster, as `start` wrote it.
cluster_nodes() { cat "$RUN/nodes" 2>/dev/null || echo "$NODES"; }

node_pid() {
    local file="$RUN/node-$1/pid" pid
    [ -f "$file" ] || return 1
    pid=$(cat "$file")
    kill -0 "$pid" 2>/dev/null && grep -q 'kafka.Kafka' "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

write_config() {
    local node=$1 dir="$RUN/node-$1" replicas=$NODES isr=1 voters="" i
    [ "$NODES" = 3 ] && isr=2
    for i in $(seq 1 "$NODES"); do voters="${voters:+$voters,}$i@127.0.0.1:$(controller_port "$i")"; done
    cat > "$dir/server.properties" <<EOF
process.roles=broker,controller
node.id=$node
$(if [ -f "$RUN/secure" ]; then secure_config; else cat <<PLAIN
listeners=PLAINTEXT://127.0.0.1:$(client_port "$node"),CONTROLLER://127.0.0.1:$(controller_port "$node")
advertised.listeners=PLAINTEXT://127.0.0.1:$(client_port "$node")
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
PLAIN
fi)
$(if [ "$NODES" = 1 ]; then echo "controller.quorum.bootstrap.servers=127.0.0.1:$(controller_port 1)"; else echo "controller.quorum.voters=$voters"; fi)
log.dirs=$dir/data
num.partitions=1
default.replication.factor=$replicas
min.insync.replicas=$isr
offsets.topic.replication.factor=$replicas
transaction.state.log.replication.factor=$replicas
transaction.state.log.min.isr=$isr
# Tests join groups all the time: no wait for more members before the first assignment.
group.initial.rebalance.delay.ms=0
EOF
}

start_node() {
    local node=$1 dir="$RUN/node-$1" java
    java=$(java_home)/bin/java
    # KAFKA_HEAP_OPTS-style limits: three nodes, the stages and an LLM share 24 GB and 2 cores.
    nohup "$java" -Xms128m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" -Dkafka.logs.dir="$dir" \
        -cp "$LIBS/*" kafka.Kafka "$dir/server.properties" > "$dir/stdout.log" 2>&1 < /dev/null &
    echo $! > "$dir/pid"
}

# Whether the process start_node began is alive. Not node_pid: the shell it forked becomes
# `nohup java ... kafka.Kafka` only at its exec, which a loaded machine can run seconds late, and
# meanwhile its command line is this script's (a start took such a node for dead).
started_alive() {
    local pid; pid=$(cat "$RUN/node-$1/pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null
}

wait_node() {
    local node=$1 port; port=$(client_port "$1")
    for _ in $(seq 1 120); do
        port_open "$port" && return 0
        started_alive "$node" || { tail -20 "$RUN/node-$node/server.log" "$RUN/node-$node/stdout.log" >&2 2>/dev/null; die "node $node exited while starting (log: $RUN/node-$node/server.log)"; }
        sleep 0.5
    done
    die "node $node's port $port did not open in 60 s (log: $RUN/node-$node/server.log)"
}

# Waits until the cluster answers an admin call (the controllers have a leader and every broker has
# registered): an open port alone can still refuse metadata for a moment.
wait_ready() {
    local java config; java=$(java_home)/bin/java
    mapfile -t config < <(admin_config)
    for _ in $(seq 1 60); do
        local brokers
        brokers=$("$java" -Xmx128m -cp "$LIBS/*" -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" \
            -Dkafka.logs.dir="$RUN" org.apache.kafka.tools.BrokerApiVersionsCommand \
            --bootstrap-server "127.0.0.1:$PORT" "${config[@]}" 2>/dev/null | grep -c '^127.0.0.1:' || true)
        [ "$brokers" -ge "$(cluster_nodes)" ] && return 0
        sleep 1
    done
    die "the cluster at 127.0.0.1:$PORT did not register its $(cluster_nodes) broker(s) in 60 s"
}

stop_node() {
    local node=$1 signal=${2:-TERM} pid
    pid=$(node_pid "$node") || return 0
    kill "-$signal" "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$RUN/node-$node/pid"
}

# One of Kafka's admin tools (a class under org.apache.kafka.tools) against the cluster, its log
# beside the cluster's (our log4j2 configuration writes to ${kafka.logs.dir}), not into a folder
# named after the unset property in the working directory.
tool() {
    local class=$1 config; shift
    mapfile -t config < <(admin_config)
    "$(java_home)/bin/java" -Xmx256m -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" \
        -Dkafka.logs.dir="$RUN" -cp "$LIBS/*" "org.apache.kafka.tools.$class" --bootstrap-server "127.0.0.1:$PORT" "${config[@]}" "$@"
}

need_node() { [ -n "$NODE" ] && [ -d "$RUN/node-$NODE" ] || die "--node I names a node of the cluster at port $PORT"; }

case "$CMD" in
    install) install; echo "$LIBS" ;;
    start)
        case "$NODES" in 1|3) ;; *) die "--nodes is 1 or 3" ;; esac
        [ "$SECURE" = 0 ] || [ "$NODES" = 1 ] || die "--secure starts one node"
        install
        if [ -f "$RUN/nodes" ] && node_pid 1 > /dev/null; then log "already running at 127.0.0.1:$PORT"; exit 0; fi
        for i in $(seq 1 "$NODES"); do
            for p in "$(client_port "$i")" "$(controller_port "$i")"; do
                port_open "$p" && die "port $p is taken by another process"
            done
        done
        rm -rf "$RUN"; mkdir -p "$RUN"; echo "$NODES" > "$RUN/nodes"
        scram=()
        if [ "$SECURE" = 1 ]; then secure_material; mapfile -t scram < <(secure_users); fi
        # A fresh cluster id and storage every start: nothing of an earlier run is seen.
        # Not starting with '-', which the storage tool would read as an option (Kafka's own
        # Uuid.randomUuid() rejects those ids for the same reason).
        cluster_id=-
        while [ "${cluster_id#-}" != "$cluster_id" ]; do
            cluster_id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
        done
        java=$(java_home)/bin/java
        for i in $(seq 1 "$NODES"); do
            mkdir -p "$RUN/node-$i"
            write_config "$i"
            standalone=(); [ "$NODES" = 1 ] && standalone=(--standalone)
            "$java" -Xmx256m -cp "$LIBS/*" -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" \
                -Dkafka.logs.dir="$RUN/node-$i/format" kafka.tools.StorageTool format --cluster-id "$cluster_id" \
                "${standalone[@]}" "${scram[@]}" -c "$RUN/node-$i/server.properties" > "$RUN/node-$i/format.log" 2>&1 ||
                { cat "$RUN/node-$i/format.log" >&2; die "formatting node $i's storage failed"; }
        done
        for i in $(seq 1 "$NODES"); do start_node "$i"; done
        for i in $(seq 1 "$NODES"); do wait_node "$i"; done
        wait_ready
        log "Apache Kafka $VERSION running: $NODES node(s), 127.0.0.1:$PORT (pids $(for i in $(seq 1 "$NODES"); do node_pid "$i"; done | tr '\n' ' '))"
        [ "$SECURE" = 0 ] || log "over SASL_SSL (SCRAM-SHA-512, StandardAuthorizer): trust $RUN/tls/ca.crt; users admin${USERS:+,$USERS}, password <user>-secret" ;;
    stop)
        [ -d "$RUN" ] || exit 0
        # Every node at once: stopped one by one, the last ones wait for a quorum that is gone.
        for i in $(seq 1 "$(cluster_nodes)"); do stop_node "$i" & done
        wait
        log "stopped the cluster at 127.0.0.1:$PORT"
        # The nodes' logs outlive their cluster: a test that stalled (a node slow to come back, a
        # coordinator that does not move) is read after the test stopped it.
        keep="$RUN.logs"; rm -rf "$keep"; mkdir -p "$keep"
        for dir in "$RUN"/node-*; do
            if [ -f "$dir/server.log" ]; then cp "$dir/server.log" "$keep/$(basename "$dir").log"; fi
        done
        rm -rf "$RUN" ;;
    restart)
        need_node; NODES=$(cluster_nodes)
        if [ "$CRASH" = 1 ]; then stop_node "$NODE" KILL; else stop_node "$NODE"; fi
        start_node "$NODE"; wait_node "$NODE"; wait_ready
        log "node $NODE restarted (pid $(node_pid "$NODE"))" ;;
    kill) need_node; stop_node "$NODE" KILL; log "node $NODE killed" ;;
    resume) need_node; NODES=$(cluster_nodes); start_node "$NODE"; wait_node "$NODE"; wait_ready; log "node $NODE resumed" ;;
    status) for i in $(seq 1 "$(cluster_nodes)"); do node_pid "$i" > /dev/null && port_open "$(client_port "$i")" || exit 1; done ;;
    pid) need_node; node_pid "$NODE" ;;
    # Kafka's own TransactionsCommand: the transactional ids, each with its coordinator's node id.
    transactions) tool TransactionsCommand list ;;
    # Every group's committed offsets, log end offsets and lag, partition by partition, and the
    # transactions open past their timeout on each node: what a stalled stream is read from.
    groups) tool consumer.group.ConsumerGroupCommand --describe --all-groups ;;
    # A table of ACLs (`lacuna acls` prints one) added or removed as the super user, on a --secure node.
    acls)
        [ -f "$RUN/secure" ] || die "acls: the cluster at port $PORT was not started with --secure"
        [ "${#ARGS[@]}" = 2 ] || die "acls add|remove FILE (- for stdin)"
        "$(java_home)/bin/java" -Xmx256m -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" \
            -Dkafka.logs.dir="$RUN" -cp "$LIBS/*" "$HERE/kafka/Acls.java" "$RUN/admin.properties" "${ARGS[@]}" ;;
    hanging) for i in $(seq 1 "$(cluster_nodes)"); do tool TransactionsCommand find-hanging --broker-id "$i"; done ;;
    *) sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
