#!/usr/bin/env bash
# A local relay-lite cluster in one command: a throwaway PostgreSQL (Debian's server binaries,
# initdb + pg_ctl in a temp dir, loopback only) and three relay-lite instances on it, each on its
# own loopback port and all answering to one public URL, as behind a load balancer. Ctrl-C stops
# everything and deletes the temp dir.
#
#   scripts/pg-cluster.sh                 # builds relay-lite (debug) first
#   RELAY_LITE=path/to/relay-lite scripts/pg-cluster.sh
#   PORTS="8081 8082 8083" PG_PORT=54329 PUBLIC_URL=http://localhost:8081 scripts/pg-cluster.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PORTS=(${PORTS:-8081 8082 8083})
PG_PORT="${PG_PORT:-54329}"
PUBLIC_URL="${PUBLIC_URL:-http://localhost:${PORTS[0]}}"

pg_bin="${SWITCHBOARD_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}"
if [ -z "$pg_bin" ] || [ ! -x "$pg_bin/initdb" ]; then
  echo "no PostgreSQL server binaries: apt-get install postgresql" >&2
  exit 1
fi
if [ -z "${RELAY_LITE:-}" ]; then
  cargo build --workspace --quiet --bin relay-lite
  RELAY_LITE="${CARGO_TARGET_DIR:-target}/debug/relay-lite"
fi

dir="$(mktemp -d /tmp/relay-lite-cluster.XXXXXX)"
as_pg=()
if [ "$(id -u)" = 0 ]; then
  chown postgres: "$dir"
  as_pg=(runuser -u postgres --)
fi
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait "${pids[@]}" 2>/dev/null || true
  "${as_pg[@]}" "$pg_bin/pg_ctl" -D "$dir/data" -m fast stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT INT TERM

"${as_pg[@]}" "$pg_bin/initdb" -A trust -U postgres --no-sync -D "$dir/data" >/dev/null
"${as_pg[@]}" "$pg_bin/pg_ctl" -D "$dir/data" -w -l "$dir/postgres.log" \
  -o "-k $dir -h 127.0.0.1 -p $PG_PORT" start >/dev/null
"${as_pg[@]}" "$pg_bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres relay
database="postgres://postgres@127.0.0.1:$PG_PORT/relay"
echo "postgresql: $database (log $dir/postgres.log)"

for i in "${!PORTS[@]}"; do
  mkdir -p "$dir/relay-$i"
  "$RELAY_LITE" --listen "127.0.0.1:${PORTS[$i]}" --data "$dir/relay-$i" --database "$database" \
    --public-url "$PUBLIC_URL" &
  pids+=($!)
  # The first instance runs the migrations; let it finish before the others start.
  [ "$i" = 0 ] && sleep 1
done
echo "three relay-lite instances on ${PORTS[*]}, public URL $PUBLIC_URL; Ctrl-C stops them"
wait -n "${pids[@]}"
echo "a relay-lite instance exited; stopping the cluster" >&2
exit 1
