#!/usr/bin/env bash
# A RabbitMQ 4.3 node of the tests' own, beside the machine's broker and never touching it:
# Debian's forky suite (rabbitmq-server 4.3) debootstrapped into a root of its own (cached
# between runs), run there under chroot with its own ports, epmd, cookie and data. Its
# processes are found by their root, so a signal never reaches the machine's node.
#
#   scripts/rabbitmq4.sh start    make the root if missing, start the node, wait until it serves
#   scripts/rabbitmq4.sh stop     stop the node (by pid, checked to be this root's)
#   scripts/rabbitmq4.sh status   exit 0 if the node serves
#   scripts/rabbitmq4.sh run CMD  start the node, run CMD, check that nothing used a feature
#                                 RabbitMQ 4 deprecates, stop the node: CMD's failure or the check's
#
# rabbitmqctl and rabbitmq-diagnostics for the node: $RABBITMQ4_HOME/bin/ (made by start).
set -euo pipefail

CACHE="${RABBITMQ4_HOME:-/var/cache/async-task-worker/rabbitmq-4.3}"
ROOT="$CACHE/root"
BIN="$CACHE/bin"
AMQP_PORT=5681
MANAGEMENT_PORT=15681
SUITE=forky
MIRROR=http://deb.debian.org/debian

# The node's environment, inside the root: nothing of the machine's own RabbitMQ setup.
node_env=(
  HOME=/srv/home LANG=C.UTF-8 LC_ALL=C.UTF-8 PATH=/usr/sbin:/usr/bin:/sbin:/bin
  ERL_EPMD_PORT=4381 ERL_EPMD_ADDRESS=127.0.0.1
  RABBITMQ_NODENAME=rabbit4@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  RABBITMQ_NODE_PORT=$AMQP_PORT RABBITMQ_DIST_PORT=25681
  RABBITMQ_CTL_DIST_PORT_MIN=35681 RABBITMQ_CTL_DIST_PORT_MAX=35699
  RABBITMQ_MNESIA_BASE=/srv/node/mnesia RABBITMQ_LOG_BASE=/srv/node/log
  RABBITMQ_CONFIG_FILE=/srv/node/rabbitmq.conf
  RABBITMQ_ENABLED_PLUGINS_FILE=/srv/node/enabled_plugins
  RABBITMQ_CONF_ENV_FILE=/srv/node/rabbitmq-env.conf RABBITMQ_PID_FILE=/srv/node/pid
)

in_root() { chroot "$ROOT" /usr/bin/env -i "${node_env[@]}" "$@"; }

make_root() {
  [ -e "$ROOT/.complete" ] && return 0
  echo "rabbitmq4: making a Debian $SUITE root with rabbitmq-server in $ROOT (once; about a minute)"
  if ! command -v debootstrap >/dev/null; then
    apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null
  fi
  rm -rf "$ROOT.partial"
  mkdir -p "$CACHE"
  # Debian's debootstrap scripts name forky only from trixie on: it is built as sid is.
  debootstrap --variant=minbase --include=rabbitmq-server "$SUITE" "$ROOT.partial" "$MIRROR" \
    /usr/share/debootstrap/scripts/sid >"$CACHE/debootstrap.log" 2>&1 ||
    { tail -20 "$CACHE/debootstrap.log"; exit 1; }
  printf '127.0.0.1 localhost\n::1 localhost\n' >"$ROOT.partial/etc/hosts"
  touch "$ROOT.partial/.complete"
  mv "$ROOT.partial" "$ROOT"
}

configure() {
  mkdir -p "$ROOT/srv/node/mnesia" "$ROOT/srv/node/log" "$ROOT/srv/home" "$BIN"
  if [ ! -s "$ROOT/srv/home/.erlang.cookie" ]; then
    od -An -N20 -tx1 /dev/urandom | tr -d ' \n' | tr a-f A-F >"$ROOT/srv/home/.erlang.cookie"
    chmod 600 "$ROOT/srv/home/.erlang.cookie"
  fi
  cat >"$ROOT/srv/node/rabbitmq.conf" <<CONF
listeners.tcp.default = 127.0.0.1:$AMQP_PORT
management.tcp.ip = 127.0.0.1
management.tcp.port = $MANAGEMENT_PORT
loopback_users = none
log.console = false
log.file.level = info
CONF
  echo '[rabbitmq_management].' >"$ROOT/srv/node/enabled_plugins"
  : >"$ROOT/srv/node/rabbitmq-env.conf"
  for tool in rabbitmqctl rabbitmq-diagnostics rabbitmq-queues; do
    {
      echo '#!/usr/bin/env bash'
      echo "# $tool of the RabbitMQ 4 node in $ROOT (made by scripts/rabbitmq4.sh)."
      printf 'exec chroot %q /usr/bin/env -i' "$ROOT"
      printf ' %q' "${node_env[@]}"
      echo " /usr/lib/rabbitmq/bin/$tool \"\$@\""
    } >"$BIN/$tool"
    chmod +x "$BIN/$tool"
  done
}

# The pids of processes running in this root (the node, its epmd, their helpers).
root_pids() {
  local real pid
  real="$(readlink -f "$ROOT")"
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$real" ] && echo "$pid"
  done
  return 0
}

# The node reads its memory use from /proc (its management agent stops the boot without it); the
# root's /proc is mounted while the node runs, unmounted when it stops.
mount_proc() { mountpoint -q "$ROOT/proc" || mount -t proc proc "$ROOT/proc"; }
unmount_proc() { ! mountpoint -q "$ROOT/proc" || umount "$ROOT/proc" || umount -l "$ROOT/proc"; }

serves() { in_root /usr/lib/rabbitmq/bin/rabbitmqctl -q -t 10 await_startup >/dev/null 2>&1; }

start() {
  make_root
  configure
  mount_proc
  if serves; then
    echo "rabbitmq4: already serving on 127.0.0.1:$AMQP_PORT"
    return 0
  fi
  setsid chroot "$ROOT" /usr/bin/env -i "${node_env[@]}" /usr/lib/rabbitmq/bin/rabbitmq-server \
    >>"$CACHE/server.out" 2>&1 </dev/null &
  local started=$SECONDS
  # await_startup fails at once until the node has registered with its epmd: asked again.
  until in_root /usr/lib/rabbitmq/bin/rabbitmqctl -q -t 120 await_startup >/dev/null 2>&1; do
    if ((SECONDS - started > 180)); then
      echo "rabbitmq4: the node did not start; see $ROOT/srv/node/log and $CACHE/server.out"
      exit 1
    fi
    sleep 1
  done
  echo "rabbitmq4: $(in_root /usr/lib/rabbitmq/bin/rabbitmqctl -q version) serving on 127.0.0.1:$AMQP_PORT (management $MANAGEMENT_PORT) after $((SECONDS - started)) s"
}

stop() {
  [ -d "$ROOT" ] || return 0
  stop_node
  unmount_proc
}

stop_node() {
  local pids
  pids="$(root_pids)"
  [ -n "$pids" ] || return 0
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null || true
  for _ in $(seq 60); do
    [ -z "$(root_pids)" ] && return 0
    sleep 0.5
  done
  pids="$(root_pids)"
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  sleep 0.5
}

# Runs "$@" against the node, then asks it whether anything used a deprecated feature (global
# QoS, transient non-exclusive queues, ...); the node is stopped whatever happens.
run_suite() {
  start
  trap stop EXIT
  local status=0
  "$@" || status=$?
  if ! in_root /usr/lib/rabbitmq/bin/rabbitmq-diagnostics -q check_if_any_deprecated_features_are_used; then
    echo "rabbitmq4: a deprecated feature of RabbitMQ 4 was used"
    ((status != 0)) || status=1
  fi
  return "$status"
}

case "${1:-}" in
  start) start ;;
  run) shift; run_suite "$@" ;;
  stop) stop ;;
  status) serves ;;
  *) echo "usage: $0 start|stop|status|run CMD..." >&2; exit 2 ;;
esac
