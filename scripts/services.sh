#!/usr/bin/env bash
# scripts/services.sh: local Kafka (single-node KRaft), MinIO, PostgreSQL and an Iceberg REST catalog
# for rllm-pipe, without Docker.
#
#   scripts/services.sh up              install (cached) + start all, wait until healthy, print env
#   scripts/services.sh down [--clean]  stop all (SIGTERM, 20 s, then SIGKILL); --clean also deletes data
#   scripts/services.sh env             print the export lines: eval "$(scripts/services.sh env)"
#   scripts/services.sh status          one line per service; exit 0 only if all are running
#   scripts/services.sh kafka-stop | kafka-start | minio-stop | minio-start    (fault injection)
#   scripts/services.sh iceberg-rest-stop | iceberg-rest-start
#   scripts/services.sh logs kafka|minio|iceberg-rest [-f] [-n LINES]
#
# Kafka's jars come from Maven (scripts/kafka/pom.xml) into the cache, MinIO is built once with
# `go install`; PostgreSQL (the Iceberg SQL catalog's tests) is Debian's package, installed with
# apt-get when absent, its cluster in the state folder, trusting loopback connections only.
# The Iceberg REST catalog (the REST catalog's tests) is Apache Iceberg's REST catalog fixture
# (org.apache.iceberg.rest.RESTCatalogServer, the server of the apache/iceberg-rest-fixture image),
# its jars from Maven (scripts/iceberg-rest/pom.xml) into the cache, run by a small launcher that
# binds it to loopback; its backend is the JDBC catalog on a SQLite file, its warehouse a folder
# (file://), both in the state folder.
# Everything is started in the background (setsid + nohup) and survives the caller.
#
# Environment:
#   RLLM_CACHE           cache for the Kafka jars and the MinIO binary  (default ~/.cache/rllm-pipe)
#   RLLM_SERVICES_DIR    state: data, logs, pid files                   (default <repo>/.services)
#   RLLM_KAFKA_PORT      Kafka broker port          (default 9092; controller listener = port+1)
#   RLLM_MINIO_PORT      MinIO S3 API port          (default 9000; console = port+1)
#   RLLM_PG_PORT         PostgreSQL port            (default 5433)
#   RLLM_ICEBERG_REST_PORT  Iceberg REST catalog port (default 8181)
#   RLLM_KAFKA_CONTROLLER_PORT, RLLM_MINIO_CONSOLE_PORT   override the "+1" ports
#   RLLM_KAFKA_VERSION   Kafka version fetched from Maven (default 4.1.1)
#   RLLM_SERVICES_TIMEOUT seconds to wait for a service to become healthy (default 60)
#   JAVA_HOME            Java 17+ used for Kafka and the Iceberg REST catalog (default: java on
#                        PATH; the REST catalog's launcher is compiled once, with javac: a JDK)
set -euo pipefail

SCRIPT_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd -P)
REPO_DIR=$(cd -- "$SCRIPT_DIR/.." && pwd -P)

abspath() { case $1 in /*) printf '%s\n' "$1" ;; *) printf '%s\n' "$PWD/$1" ;; esac; }

KAFKA_VERSION=${RLLM_KAFKA_VERSION:-4.1.1}
ICEBERG_REST_VERSION=1.12.0 # scripts/iceberg-rest/pom.xml's iceberg.version
MINIO_MODULE=github.com/minio/minio
MINIO_VERSION=v0.0.0-20260212201848-7aac2a2c5b7c

CACHE_DIR=$(abspath "${RLLM_CACHE:-${HOME:?HOME is not set}/.cache/rllm-pipe}")
STATE_DIR=$(abspath "${RLLM_SERVICES_DIR:-$REPO_DIR/.services}")

HOST=127.0.0.1
KAFKA_PORT=${RLLM_KAFKA_PORT:-9092}
KAFKA_CONTROLLER_PORT=${RLLM_KAFKA_CONTROLLER_PORT:-$((KAFKA_PORT + 1))}
MINIO_PORT=${RLLM_MINIO_PORT:-9000}
MINIO_CONSOLE_PORT=${RLLM_MINIO_CONSOLE_PORT:-$((MINIO_PORT + 1))}
PG_PORT=${RLLM_PG_PORT:-5433}
ICEBERG_REST_PORT=${RLLM_ICEBERG_REST_PORT:-8181}
PG_DB=rllm_test
MINIO_USER=rllmpipe
MINIO_PASSWORD=rllmpipe-secret
HEALTH_TIMEOUT=${RLLM_SERVICES_TIMEOUT:-60}
STOP_TIMEOUT=20

KAFKA_POM=$REPO_DIR/scripts/kafka/pom.xml
KAFKA_HOME=$CACHE_DIR/kafka-$KAFKA_VERSION
KAFKA_LIBS=$KAFKA_HOME/libs
MINIO_BIN=$CACHE_DIR/bin/minio
ICEBERG_REST_POM=$REPO_DIR/scripts/iceberg-rest/pom.xml
ICEBERG_REST_HOME=$CACHE_DIR/iceberg-rest-$ICEBERG_REST_VERSION
ICEBERG_REST_LIBS=$ICEBERG_REST_HOME/libs

RUN_DIR=$STATE_DIR/run
LOG_DIR=$STATE_DIR/logs
KAFKA_STATE=$STATE_DIR/kafka
KAFKA_DATA=$KAFKA_STATE/data
MINIO_DATA=$STATE_DIR/minio-data
PG_DATA=$STATE_DIR/postgres
ICEBERG_REST_STATE=$STATE_DIR/iceberg-rest

JAVA=${JAVA_HOME:+$JAVA_HOME/bin/}java
JAVAC=${JAVA_HOME:+$JAVA_HOME/bin/}javac

# ---------------------------------------------------------------------------------------------
# helpers

log() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: error: %s\n' "$*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

CLEANUP=()
# shellcheck disable=SC2329 # invoked by the EXIT trap
cleanup() { if ((${#CLEANUP[@]})); then rm -rf "${CLEANUP[@]}"; fi; }
trap cleanup EXIT

# with_timeout SECS cmd...: run cmd, killed after SECS if coreutils' timeout exists.
with_timeout() {
  local secs=$1; shift
  if have timeout; then timeout "$secs" "$@"; else "$@"; fi
}

# Serialize everything that changes state (one lock per state dir); fd 9.
lock_state() {
  mkdir -p "$STATE_DIR"
  have flock || return 0
  exec 9>>"$STATE_DIR/.lock"
  if ! flock -n 9; then
    log "another services.sh is working on $STATE_DIR; waiting for it ..."
    flock -w 1800 9 || die "timed out waiting for $STATE_DIR/.lock"
  fi
}

# Serialize installs into the shared cache (several checkouts may share it); fd 8.
lock_cache() {
  mkdir -p "$CACHE_DIR"
  have flock || return 0
  exec 8>>"$CACHE_DIR/.lock"
  if ! flock -n 8; then
    log "another services.sh is installing into $CACHE_DIR; waiting for it ..."
    flock -w 1800 8 || die "timed out waiting for $CACHE_DIR/.lock"
  fi
}
unlock_cache() { if have flock; then exec 8>&-; fi; }

# shellcheck disable=SC2016 # $0/$1 are expanded by the inner bash
port_open() { with_timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$HOST" "$1" 2>/dev/null; }

http_ok() {
  if have curl; then
    curl -fsS -o /dev/null --max-time 3 "$1" 2>/dev/null
  else # plain bash fallback: http://host:port/path -> status 200
    local rest=${1#http://} hostport path
    hostport=${rest%%/*}; path=/${rest#*/}
    # shellcheck disable=SC2016 # expanded by the inner bash
    with_timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1" && printf "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n" "$2" "$0" >&3 &&
      IFS= read -r line <&3 && [[ $line == "HTTP/1."?" 200"* ]]' "${hostport%:*}" "${hostport##*:}" "$path" 2>/dev/null
  fi
}

file_size() { if [[ -f $1 ]]; then wc -c <"$1" | tr -d ' '; else echo 0; fi; }

# is_alive PID: exists and is not a zombie.
is_alive() {
  kill -0 "$1" 2>/dev/null || return 1
  if [[ -r /proc/$1/stat ]]; then
    local st; st=$(<"/proc/$1/stat") || return 1
    st=${st##*) }
    [[ ${st:0:1} != Z ]]
  fi
}

cmdline_of() {
  if [[ -r /proc/$1/cmdline ]]; then tr '\0' ' ' <"/proc/$1/cmdline"; else ps -p "$1" -o args= 2>/dev/null; fi
}

# pid_of SERVICE: print the pid of our running instance (pid file + liveness + command line match).
pid_of() {
  local f=$RUN_DIR/$1.pid pid cmd
  [[ -s $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  is_alive "$pid" || return 1
  cmd=$(cmdline_of "$pid") || return 1
  case $1 in
    kafka) [[ $cmd == *kafka.Kafka* ]] || return 1 ;;
    minio) [[ $cmd == *minio*server* ]] || return 1 ;;
    iceberg-rest) [[ $cmd == *RllmIcebergRest* ]] || return 1 ;;
  esac
  printf '%s\n' "$pid"
}

# launch SERVICE LOGFILE cmd...: start cmd detached (own session, no tty, stdio -> LOGFILE,
# lock fds closed) and record its pid.
launch() {
  local name=$1 logf=$2; shift 2
  local pidf=$RUN_DIR/$name.pid
  mkdir -p "$RUN_DIR" "$(dirname "$logf")"
  rm -f "$pidf"
  local -a detach=(nohup)
  if have setsid; then detach=(setsid nohup); fi
  (
    cd "$STATE_DIR"
    exec 8>&- 9>&- </dev/null >>"$logf" 2>&1
    # bash writes its own pid, then execs the service: the pid file names the service process.
    # shellcheck disable=SC2016
    exec "${detach[@]}" bash -c 'echo $$ >"$0"; exec "$@"' "$pidf" "$@"
  ) &
  disown "$!" 2>/dev/null || true # no job-status noise if we kill it while this script runs
  local i
  for ((i = 0; i < 100; i++)); do
    [[ -s $pidf ]] && return 0
    sleep 0.05
  done
  die "$name did not start (no pid file $pidf); see $logf"
}

# stop_service SERVICE: SIGTERM, wait up to STOP_TIMEOUT s, then SIGKILL; remove the pid file.
stop_service() {
  local name=$1 pid i
  if ! pid=$(pid_of "$name"); then
    rm -f "$RUN_DIR/$name.pid"
    log "$name is not running"
    return 0
  fi
  log "stopping $name (pid $pid) ..."
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
    is_alive "$pid" || break
    sleep 0.1
  done
  if is_alive "$pid"; then
    log "$name did not exit within ${STOP_TIMEOUT}s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
      is_alive "$pid" || break
      sleep 0.1
    done
  fi
  rm -f "$RUN_DIR/$name.pid"
  log "$name stopped"
}

# fail_start SERVICE LOGFILE OFFSET MESSAGE: report with the log tail, stop the half-started
# process, exit 1.
fail_start() {
  local name=$1 logf=$2 offset=$3 msg=$4
  {
    printf 'services: error: %s\n' "$msg"
    printf 'services: ---- last lines of %s ----\n' "$logf"
    if [[ -f $logf ]]; then tail -c +"$((offset + 1))" "$logf" | tail -n 40; fi
    printf 'services: ----\n'
  } >&2
  stop_service "$name" || true
  exit 1
}

# ---------------------------------------------------------------------------------------------
# Kafka

java_check() {
  have "$JAVA" || [[ -x $JAVA ]] || die "java not found (Kafka $KAFKA_VERSION needs Java 17+; set JAVA_HOME)"
  local v major
  v=$("$JAVA" -version 2>&1 | awk -F'"' '/version/ {print $2; exit}')
  major=${v%%.*}
  [[ $major == 1 ]] && major=$(echo "$v" | cut -d. -f2)
  if ! [[ $major =~ ^[0-9]+$ ]] || ((major < 17)); then
    die "Kafka $KAFKA_VERSION needs Java 17+, found '$v' ($JAVA)"
  fi
}

pom_sum() { cksum <"$KAFKA_POM" | awk '{print $1 "-" $2}'; }

kafka_installed() {
  [[ -f $KAFKA_HOME/.installed && -f $KAFKA_LIBS/kafka_2.13-$KAFKA_VERSION.jar ]] &&
    [[ $(<"$KAFKA_HOME/.installed") == "$(pom_sum)" ]]
}

kafka_install() {
  kafka_installed && return 0
  lock_cache
  if ! kafka_installed; then
    have mvn || die "mvn not found (needed once to fetch Kafka's jars)"
    log "fetching Kafka $KAFKA_VERSION jars with Maven into $KAFKA_HOME (one time) ..."
    local t0=$SECONDS tmp=$KAFKA_HOME.tmp.$$ out
    CLEANUP+=("$tmp")
    rm -rf "$tmp"
    mkdir -p "$tmp"
    if ! out=$(cd "$tmp" && mvn -q -B -f "$KAFKA_POM" -Dkafka.version="$KAFKA_VERSION" \
      dependency:copy-dependencies -DoutputDirectory="$tmp/libs" 2>&1); then
      printf '%s\n' "$out" | tail -n 30 >&2
      die "could not fetch org.apache.kafka:kafka_2.13:$KAFKA_VERSION with Maven (try RLLM_KAFKA_VERSION=4.0.1)"
    fi
    [[ -f $tmp/libs/kafka_2.13-$KAFKA_VERSION.jar ]] || die "Maven did not produce kafka_2.13-$KAFKA_VERSION.jar"
    pom_sum >"$tmp/.installed"
    rm -rf "$KAFKA_HOME"
    mv "$tmp" "$KAFKA_HOME"
    log "Kafka $KAFKA_VERSION jars ready ($((SECONDS - t0))s)"
  fi
  unlock_cache
}

# kafka_tool CLASS args...: run a Kafka command-line class from the cached jars (quiet logging).
kafka_tool() {
  "$JAVA" -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_STATE/tools-log4j2.properties" \
    -cp "$KAFKA_LIBS/*" "$@"
}

kafka_write_config() {
  mkdir -p "$KAFKA_DATA" "$LOG_DIR"
  cat >"$KAFKA_STATE/server.properties" <<EOF
# Generated by scripts/services.sh on every start; edit the script, not this file.
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=$HOST:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://$HOST:$KAFKA_PORT,CONTROLLER://$HOST:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://$HOST:$KAFKA_PORT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$KAFKA_DATA
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
EOF
  cat >"$KAFKA_STATE/log4j2.properties" <<'EOF'
# Broker logging: everything to stdout, which services.sh redirects to logs/kafka.log.
name = rllm-kafka
status = warn
# Kafka shuts down in its own shutdown hook; keep logging alive until the JVM exits.
shutdownHook = disable
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
EOF
  cat >"$KAFKA_STATE/tools-log4j2.properties" <<'EOF'
name = rllm-kafka-tools
status = error
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
EOF
  cat >"$KAFKA_STATE/tools-admin.properties" <<'EOF'
request.timeout.ms=5000
default.api.timeout.ms=10000
socket.connection.setup.timeout.ms=2000
socket.connection.setup.timeout.max.ms=5000
EOF
}

# Format the storage once (single-node dynamic quorum). The controller's endpoint is recorded in
# the metadata log, so the ports are pinned to the data directory.
kafka_format_if_needed() {
  local ports="$KAFKA_PORT $KAFKA_CONTROLLER_PORT"
  if [[ -f $KAFKA_DATA/meta.properties ]]; then
    if [[ -f $KAFKA_STATE/ports && $(<"$KAFKA_STATE/ports") != "$ports" ]]; then
      die "Kafka data in $KAFKA_DATA was formatted for ports $(<"$KAFKA_STATE/ports") (broker, controller), not $ports; run '$0 down --clean' or use another RLLM_SERVICES_DIR"
    fi
    return 0
  fi
  local id out
  rm -rf "$KAFKA_DATA"
  mkdir -p "$KAFKA_DATA"
  id=$(kafka_tool kafka.tools.StorageTool random-uuid) || die "kafka-storage random-uuid failed"
  if ! out=$(kafka_tool kafka.tools.StorageTool format --standalone -t "$id" -c "$KAFKA_STATE/server.properties" 2>&1); then
    printf '%s\n' "$out" >&2
    rm -rf "$KAFKA_DATA"
    die "formatting Kafka storage failed"
  fi
  printf '%s\n' "$id" >"$KAFKA_STATE/cluster-id"
  printf '%s\n' "$ports" >"$KAFKA_STATE/ports"
  log "formatted Kafka storage in $KAFKA_DATA (cluster id $id)"
}

# A metadata round trip (lists topics); needs the jars.
kafka_metadata_ok() {
  [[ -f $KAFKA_STATE/tools-admin.properties ]] || kafka_write_config
  with_timeout 30 "$JAVA" -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_STATE/tools-log4j2.properties" -cp "$KAFKA_LIBS/*" \
    org.apache.kafka.tools.TopicCommand --bootstrap-server "$HOST:$KAFKA_PORT" \
    --command-config "$KAFKA_STATE/tools-admin.properties" --list >/dev/null 2>&1
}

kafka_healthy() { port_open "$KAFKA_PORT" && kafka_metadata_ok; }

# kafka_wait PID OFFSET: wait for "Kafka Server started" (after OFFSET in the log) + port, then a
# metadata request.
kafka_wait() {
  local pid=$1 offset=$2 logf=$LOG_DIR/kafka.log deadline=$((SECONDS + HEALTH_TIMEOUT)) started=''
  while :; do
    is_alive "$pid" || fail_start kafka "$logf" "$offset" "Kafka exited during startup"
    if [[ -z $started ]] && port_open "$KAFKA_PORT" &&
      tail -c +"$((offset + 1))" "$logf" 2>/dev/null | grep -q 'Kafka Server started'; then
      started=1
    fi
    if [[ -n $started ]] && kafka_metadata_ok; then return 0; fi
    ((SECONDS < deadline)) || fail_start kafka "$logf" "$offset" "Kafka did not become healthy within ${HEALTH_TIMEOUT}s"
    sleep 0.5
  done
}

kafka_start() {
  local pid
  if pid=$(pid_of kafka); then
    if kafka_healthy; then return 0; fi
    log "Kafka (pid $pid) is running; waiting for it to become healthy ..."
    java_check
    kafka_wait "$pid" "$(file_size "$LOG_DIR/kafka.log")"
    return 0
  fi
  rm -f "$RUN_DIR/kafka.pid"
  if port_open "$KAFKA_PORT"; then
    if [[ ! -f $KAFKA_LIBS/kafka_2.13-$KAFKA_VERSION.jar ]] || { java_check && kafka_metadata_ok; }; then
      log "$HOST:$KAFKA_PORT is already served by a Kafka not started by this script; using it"
      return 0
    fi
    die "port $HOST:$KAFKA_PORT is in use by another process that is not a working Kafka"
  fi
  port_open "$KAFKA_CONTROLLER_PORT" && die "Kafka controller port $HOST:$KAFKA_CONTROLLER_PORT is in use by another process"

  java_check
  kafka_install
  kafka_write_config
  kafka_format_if_needed

  local logf=$LOG_DIR/kafka.log offset t0=$SECONDS
  offset=$(file_size "$logf")
  printf '\n===== %s services.sh: starting Kafka %s on %s:%s =====\n' "$(date '+%F %T')" "$KAFKA_VERSION" "$HOST" "$KAFKA_PORT" >>"$logf"
  offset=$(file_size "$logf")
  log "starting Kafka $KAFKA_VERSION on $HOST:$KAFKA_PORT (log: $logf) ..."
  launch kafka "$logf" "$JAVA" -Xms256m -Xmx1g -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_STATE/log4j2.properties" \
    -cp "$KAFKA_LIBS/*" kafka.Kafka "$KAFKA_STATE/server.properties"
  pid=$(<"$RUN_DIR/kafka.pid")
  kafka_wait "$pid" "$offset"
  log "Kafka is healthy (pid $pid, $((SECONDS - t0))s)"
}

# ---------------------------------------------------------------------------------------------
# MinIO

minio_installed() { [[ -x $MINIO_BIN && -f $MINIO_BIN.version && $(<"$MINIO_BIN.version") == "$MINIO_VERSION" ]]; }

# module version a Go binary was built from (empty if unknown)
go_bin_version() { go version -m "$1" 2>/dev/null | awk -v m="$MINIO_MODULE" '$1 == "mod" && $2 == m {print $3; exit}'; }

minio_install() {
  minio_installed && return 0
  lock_cache
  if minio_installed; then unlock_cache; return 0; fi
  have go || die "go not found (needed once to build MinIO $MINIO_VERSION)"
  mkdir -p "$CACHE_DIR/bin"

  # A plain `go install` of the same version may be running (or done) in the default GOBIN:
  # wait for it instead of compiling twice, then reuse its binary.
  local waited=0
  while have pgrep && pgrep -f "go install $MINIO_MODULE@$MINIO_VERSION" >/dev/null 2>&1; do
    ((waited == 0)) && log "a 'go install $MINIO_MODULE@$MINIO_VERSION' is already running; waiting for it ..."
    ((waited < 1800)) || break
    sleep 5
    waited=$((waited + 5))
  done
  local gobin cand
  gobin=$(go env GOBIN)
  [[ -n $gobin ]] || gobin=$(go env GOPATH | cut -d: -f1)/bin
  cand=$gobin/minio
  if [[ -x $cand && $(go_bin_version "$cand") == "$MINIO_VERSION" ]] && "$cand" --version >/dev/null 2>&1; then
    log "reusing $cand ($MINIO_VERSION) for the cache"
    cp "$cand" "$MINIO_BIN.tmp.$$"
    mv -f "$MINIO_BIN.tmp.$$" "$MINIO_BIN"
    printf '%s\n' "$MINIO_VERSION" >"$MINIO_BIN.version"
    unlock_cache
    return 0
  fi

  local t0=$SECONDS tmp=$CACHE_DIR/bin/.build.$$ blog=$CACHE_DIR/minio-build.log
  log "building MinIO $MINIO_VERSION with go install (one time; several minutes; log: $blog) ..."
  CLEANUP+=("$tmp")
  rm -rf "$tmp"
  mkdir -p "$tmp"
  if ! (cd "$tmp" && GOBIN=$tmp GOFLAGS='' GOWORK=off go install "$MINIO_MODULE@$MINIO_VERSION") >"$blog" 2>&1; then
    tail -n 30 "$blog" >&2
    die "go install $MINIO_MODULE@$MINIO_VERSION failed (log: $blog)"
  fi
  "$tmp/minio" --version >/dev/null 2>&1 || die "the freshly built minio does not run"
  mv -f "$tmp/minio" "$MINIO_BIN"
  printf '%s\n' "$MINIO_VERSION" >"$MINIO_BIN.version"
  log "MinIO built ($((SECONDS - t0))s)"
  unlock_cache
}

minio_healthy() { http_ok "http://$HOST:$MINIO_PORT/minio/health/live"; }

minio_wait() {
  local pid=$1 offset=$2 logf=$LOG_DIR/minio.log deadline=$((SECONDS + HEALTH_TIMEOUT))
  while :; do
    is_alive "$pid" || fail_start minio "$logf" "$offset" "MinIO exited during startup"
    minio_healthy && return 0
    ((SECONDS < deadline)) || fail_start minio "$logf" "$offset" "MinIO did not become healthy within ${HEALTH_TIMEOUT}s"
    sleep 0.3
  done
}

minio_start() {
  local pid
  if pid=$(pid_of minio); then
    minio_healthy && return 0
    log "MinIO (pid $pid) is running; waiting for it to become healthy ..."
    minio_wait "$pid" "$(file_size "$LOG_DIR/minio.log")"
    return 0
  fi
  rm -f "$RUN_DIR/minio.pid"
  if port_open "$MINIO_PORT"; then
    if minio_healthy; then
      log "$HOST:$MINIO_PORT is already served by a MinIO not started by this script; using it"
      return 0
    fi
    die "port $HOST:$MINIO_PORT is in use by another process that is not a working MinIO"
  fi
  port_open "$MINIO_CONSOLE_PORT" && die "MinIO console port $HOST:$MINIO_CONSOLE_PORT is in use by another process"

  minio_install
  mkdir -p "$MINIO_DATA" "$LOG_DIR"
  local logf=$LOG_DIR/minio.log offset t0=$SECONDS
  printf '\n===== %s services.sh: starting MinIO on %s:%s =====\n' "$(date '+%F %T')" "$HOST" "$MINIO_PORT" >>"$logf"
  offset=$(file_size "$logf")
  log "starting MinIO on $HOST:$MINIO_PORT, console $HOST:$MINIO_CONSOLE_PORT (log: $logf) ..."
  launch minio "$logf" env MINIO_ROOT_USER="$MINIO_USER" MINIO_ROOT_PASSWORD="$MINIO_PASSWORD" \
    "$MINIO_BIN" server "$MINIO_DATA" --address "$HOST:$MINIO_PORT" --console-address "$HOST:$MINIO_CONSOLE_PORT"
  pid=$(<"$RUN_DIR/minio.pid")
  minio_wait "$pid" "$offset"
  log "MinIO is healthy (pid $pid, $((SECONDS - t0))s)"
}

# ---------------------------------------------------------------------------------------------
# PostgreSQL

# pg_bin prints the folder of the server's programs (initdb, pg_ctl).
pg_bin() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    if [[ -x $d/pg_ctl && -x $d/initdb ]]; then printf '%s\n' "$d"; return 0; fi
  done
  if have pg_ctl && have initdb; then dirname -- "$(command -v pg_ctl)"; return 0; fi
  return 1
}

pg_install() {
  pg_bin >/dev/null && return 0
  if [[ $(id -u) == 0 ]] && have apt-get; then
    log "installing PostgreSQL (Debian's package)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null 2>&1; } ||
      die "apt-get install postgresql failed"
  fi
  pg_bin >/dev/null || die "PostgreSQL's server programs not found (install Debian's postgresql package)"
}

# as_pg runs a server program as the postgres user when we are root (the
# server refuses to run as root).
as_pg() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

pg_healthy() { port_open "$PG_PORT" && as_pg "$(pg_bin)/pg_isready" -q -h "$HOST" -p "$PG_PORT" 2>/dev/null; }

pg_start() {
  pg_install
  local bin t0=$SECONDS
  bin=$(pg_bin)
  if pg_healthy; then return 0; fi
  if [[ ! -f $PG_DATA/PG_VERSION ]]; then
    rm -rf "$PG_DATA"
    mkdir -p "$PG_DATA"
    [[ $(id -u) == 0 ]] && chown postgres: "$PG_DATA"
    chmod 700 "$PG_DATA"
    as_pg "$bin/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 >/dev/null ||
      die "initdb failed"
  fi
  # Loopback only, the socket in the data folder, its log there too
  # (written by the postgres user); the server must not inherit the
  # state and cache locks' descriptors, or it would hold them.
  as_pg "$bin/pg_ctl" -D "$PG_DATA" -l "$PG_DATA/server.log" -w -t "$HEALTH_TIMEOUT" \
    -o "-c listen_addresses=$HOST -p $PG_PORT -k $PG_DATA" start >/dev/null 8>&- 9>&- ||
    { tail -n 20 "$PG_DATA/server.log" >&2 || true; die "PostgreSQL did not start"; }
  as_pg "$bin/psql" -h "$HOST" -p "$PG_PORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" | grep -q 1 ||
    as_pg "$bin/createdb" -h "$HOST" -p "$PG_PORT" -U postgres "$PG_DB"
  log "PostgreSQL is healthy ($((SECONDS - t0))s)"
}

pg_stop() {
  local bin
  bin=$(pg_bin) || return 0
  [[ -f $PG_DATA/postmaster.pid ]] || return 0
  as_pg "$bin/pg_ctl" -D "$PG_DATA" -m fast -w -t "$STOP_TIMEOUT" stop >/dev/null 2>&1 || true
}

# ---------------------------------------------------------------------------------------------
# Iceberg REST catalog

# The launcher: the fixture's RESTCatalogServer.start() (its backend catalog from the CATALOG_*
# environment, the REST servlet, gzip), but on a connector bound to one address; the fixture's own
# main() listens on all of them. Compiled once into the cache with the jars.
iceberg_rest_launcher_source() { cat "$REPO_DIR/scripts/iceberg-rest/RllmIcebergRest.java"; }

iceberg_rest_sum() { { cat "$ICEBERG_REST_POM"; iceberg_rest_launcher_source; } | cksum | awk '{print $1 "-" $2}'; }

iceberg_rest_installed() {
  [[ -f $ICEBERG_REST_HOME/.installed && -f $ICEBERG_REST_HOME/classes/RllmIcebergRest.class ]] &&
    [[ $(<"$ICEBERG_REST_HOME/.installed") == "$(iceberg_rest_sum)" ]]
}

iceberg_rest_install() {
  iceberg_rest_installed && return 0
  lock_cache
  if ! iceberg_rest_installed; then
    have mvn || die "mvn not found (needed once to fetch the Iceberg REST catalog's jars)"
    have "$JAVAC" || [[ -x $JAVAC ]] || die "javac not found (the Iceberg REST catalog's launcher is compiled once; install a JDK 17+ or set JAVA_HOME to one)"
    log "fetching the Iceberg REST catalog's jars ($ICEBERG_REST_VERSION) with Maven into $ICEBERG_REST_HOME (one time) ..."
    local t0=$SECONDS tmp=$ICEBERG_REST_HOME.tmp.$$ out
    CLEANUP+=("$tmp")
    rm -rf "$tmp"
    mkdir -p "$tmp/src" "$tmp/classes"
    if ! out=$(cd "$tmp" && mvn -q -B -f "$ICEBERG_REST_POM" -Diceberg.version="$ICEBERG_REST_VERSION" \
      dependency:copy-dependencies -DoutputDirectory="$tmp/libs" 2>&1); then
      printf '%s\n' "$out" | tail -n 30 >&2
      die "could not fetch the Iceberg REST catalog's jars with Maven ($ICEBERG_REST_POM)"
    fi
    [[ -f $tmp/libs/iceberg-core-$ICEBERG_REST_VERSION.jar ]] || die "Maven did not produce iceberg-core-$ICEBERG_REST_VERSION.jar"
    iceberg_rest_launcher_source >"$tmp/src/RllmIcebergRest.java"
    if ! out=$("$JAVAC" -proc:none -nowarn -encoding UTF-8 -cp "$tmp/libs/*" -d "$tmp/classes" "$tmp/src/RllmIcebergRest.java" 2>&1); then
      printf '%s\n' "$out" | tail -n 30 >&2
      die "could not compile the Iceberg REST catalog's launcher"
    fi
    iceberg_rest_sum >"$tmp/.installed"
    rm -rf "$ICEBERG_REST_HOME"
    mv "$tmp" "$ICEBERG_REST_HOME"
    log "Iceberg REST catalog jars ready ($((SECONDS - t0))s)"
  fi
  unlock_cache
}

iceberg_rest_healthy() { http_ok "http://$HOST:$ICEBERG_REST_PORT/v1/config"; }

iceberg_rest_wait() {
  local pid=$1 offset=$2 logf=$LOG_DIR/iceberg-rest.log deadline=$((SECONDS + HEALTH_TIMEOUT))
  while :; do
    is_alive "$pid" || fail_start iceberg-rest "$logf" "$offset" "the Iceberg REST catalog exited during startup"
    iceberg_rest_healthy && return 0
    ((SECONDS < deadline)) || fail_start iceberg-rest "$logf" "$offset" "the Iceberg REST catalog did not become healthy within ${HEALTH_TIMEOUT}s"
    sleep 0.3
  done
}

iceberg_rest_start() {
  local pid
  if pid=$(pid_of iceberg-rest); then
    iceberg_rest_healthy && return 0
    log "the Iceberg REST catalog (pid $pid) is running; waiting for it to become healthy ..."
    iceberg_rest_wait "$pid" "$(file_size "$LOG_DIR/iceberg-rest.log")"
    return 0
  fi
  rm -f "$RUN_DIR/iceberg-rest.pid"
  if port_open "$ICEBERG_REST_PORT"; then
    if iceberg_rest_healthy; then
      log "$HOST:$ICEBERG_REST_PORT is already served by an Iceberg REST catalog not started by this script; using it"
      return 0
    fi
    die "port $HOST:$ICEBERG_REST_PORT is in use by another process that is not a working Iceberg REST catalog"
  fi

  java_check
  iceberg_rest_install
  mkdir -p "$ICEBERG_REST_STATE/warehouse" "$LOG_DIR"
  local logf=$LOG_DIR/iceberg-rest.log offset t0=$SECONDS
  printf '\n===== %s services.sh: starting the Iceberg REST catalog %s on %s:%s =====\n' "$(date '+%F %T')" "$ICEBERG_REST_VERSION" "$HOST" "$ICEBERG_REST_PORT" >>"$logf"
  offset=$(file_size "$logf")
  log "starting the Iceberg REST catalog on $HOST:$ICEBERG_REST_PORT (log: $logf) ..."
  # The fixture reads every CATALOG_* variable as a catalog property (CATALOG_IO__IMPL ->
  # io-impl): none but ours.
  local -a unset=()
  local v
  for v in $(compgen -e); do if [[ $v == CATALOG_* ]]; then unset+=(-u "$v"); fi; done
  # The JDBC catalog on SQLite (WAL, waiting for locks: requests run concurrently), Hadoop's
  # local file system writing the tables' metadata under the warehouse.
  launch iceberg-rest "$logf" env ${unset[@]+"${unset[@]}"} \
    CATALOG_CATALOG__IMPL=org.apache.iceberg.jdbc.JdbcCatalog \
    CATALOG_URI="jdbc:sqlite:$ICEBERG_REST_STATE/catalog.db?journal_mode=WAL&busy_timeout=10000" \
    CATALOG_JDBC_SCHEMA__VERSION=V1 \
    CATALOG_WAREHOUSE="file://$ICEBERG_REST_STATE/warehouse" \
    CATALOG_IO__IMPL=org.apache.iceberg.hadoop.HadoopFileIO \
    CATALOG_REST_PORT="$ICEBERG_REST_PORT" \
    "$JAVA" -Xms64m -Xmx512m -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -Drllm.rest.host="$HOST" -Dorg.slf4j.simpleLogger.showDateTime=true \
    -Dorg.slf4j.simpleLogger.dateTimeFormat='yyyy-MM-dd HH:mm:ss,SSS' \
    -cp "$ICEBERG_REST_HOME/classes:$ICEBERG_REST_LIBS/*" RllmIcebergRest
  pid=$(<"$RUN_DIR/iceberg-rest.pid")
  iceberg_rest_wait "$pid" "$offset"
  log "the Iceberg REST catalog is healthy (pid $pid, $((SECONDS - t0))s)"
}

# ---------------------------------------------------------------------------------------------
# commands

cmd_env() {
  cat <<EOF
export RLLM_PIPE_KAFKA_BROKERS=$HOST:$KAFKA_PORT
export RLLM_PIPE_S3_ENDPOINT=http://$HOST:$MINIO_PORT
export AWS_ENDPOINT_URL=http://$HOST:$MINIO_PORT
export AWS_ACCESS_KEY_ID=$MINIO_USER
export AWS_SECRET_ACCESS_KEY=$MINIO_PASSWORD
export AWS_REGION=us-east-1
export RLLM_PG_URL=postgres://postgres@$HOST:$PG_PORT/$PG_DB?sslmode=disable
export RLLM_ICEBERG_REST_URL=http://$HOST:$ICEBERG_REST_PORT
EOF
}

cmd_up() {
  local t0=$SECONDS
  lock_state
  kafka_start
  minio_start
  pg_start
  iceberg_rest_start
  log "up: Kafka $HOST:$KAFKA_PORT, MinIO $HOST:$MINIO_PORT, PostgreSQL $HOST:$PG_PORT, Iceberg REST $HOST:$ICEBERG_REST_PORT ($((SECONDS - t0))s)"
  cmd_env
}

cmd_down() {
  local clean=''
  case ${1:-} in
    "") ;;
    --clean) clean=1 ;;
    *) die "usage: $0 down [--clean]" ;;
  esac
  lock_state
  stop_service kafka
  stop_service minio
  pg_stop
  stop_service iceberg-rest
  if [[ -n $clean ]]; then
    rm -rf "$KAFKA_STATE" "$MINIO_DATA" "$PG_DATA" "$ICEBERG_REST_STATE" "$LOG_DIR" "$RUN_DIR"
    log "removed data and logs in $STATE_DIR"
  fi
}

status_line() {
  local name=$1 port=$2 pid
  if pid=$(pid_of "$name"); then
    if port_open "$port"; then
      printf '%-12s running  pid %-8s %s:%s\n' "$name" "$pid" "$HOST" "$port"
    else
      printf '%-12s running  pid %-8s %s:%s (port not accepting connections yet)\n' "$name" "$pid" "$HOST" "$port"
    fi
    return 0
  elif port_open "$port"; then
    printf '%-12s running  pid %-8s %s:%s (external: not started by services.sh)\n' "$name" "-" "$HOST" "$port"
    return 0
  else
    printf '%-12s stopped  pid %-8s %s:%s\n' "$name" "-" "$HOST" "$port"
    return 1
  fi
}

cmd_status() {
  local rc=0
  status_line kafka "$KAFKA_PORT" || rc=3
  status_line minio "$MINIO_PORT" || rc=3
  if pg_healthy; then
    printf '%-12s running  pid %-8s %s:%s\n' postgres "$(head -n 1 "$PG_DATA/postmaster.pid" 2>/dev/null || echo -)" "$HOST" "$PG_PORT"
  else
    printf '%-12s stopped  pid %-8s %s:%s\n' postgres - "$HOST" "$PG_PORT"
    rc=3
  fi
  status_line iceberg-rest "$ICEBERG_REST_PORT" || rc=3
  return "$rc"
}

cmd_logs() {
  local svc='' follow='' lines=100
  while (($#)); do
    case $1 in
      -f | --follow) follow=1 ;;
      -n) shift; lines=${1:?-n needs a number} ;;
      kafka | minio | iceberg-rest) svc=$1 ;;
      *) die "usage: $0 logs kafka|minio|iceberg-rest [-f] [-n LINES]" ;;
    esac
    shift
  done
  [[ -n $svc ]] || die "usage: $0 logs kafka|minio|iceberg-rest [-f] [-n LINES]"
  local logf=$LOG_DIR/$svc.log
  [[ -f $logf ]] || die "no log yet: $logf"
  if [[ -n $follow ]]; then exec tail -n "$lines" -F "$logf"; fi
  tail -n "$lines" "$logf"
}

usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p;}' "${BASH_SOURCE[0]}" >&2
}

main() {
  local cmd=${1:-}
  (($#)) && shift
  case $cmd in
    up) cmd_up ;;
    down) cmd_down "$@" ;;
    env) cmd_env ;;
    status) cmd_status ;;
    kafka-stop) lock_state; stop_service kafka ;;
    kafka-start) lock_state; kafka_start ;;
    minio-stop) lock_state; stop_service minio ;;
    minio-start) lock_state; minio_start ;;
    iceberg-rest-stop) lock_state; stop_service iceberg-rest ;;
    iceberg-rest-start) lock_state; iceberg_rest_start ;;
    logs) cmd_logs "$@" ;;
    -h | --help | help) usage ;;
    *) usage; exit 2 ;;
  esac
}

# (on one line, so that editing this file while it runs cannot affect the running instance)
main "$@"; exit
