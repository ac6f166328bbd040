#!/usr/bin/env bash
# The main job on a fresh machine: installs what is needed, builds, starts a relay-lite on
# loopback and the headless Switchboard runtime for the default profile (embedded SQLite), and
# prints your address. Ctrl-C stops both.
#
#   bash scripts/up.sh                 # relay on 127.0.0.1:8470, profile in the OS data dir
#   NAME=alice PORT=9000 bash scripts/up.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/switchboard-target}"
PORT="${PORT:-8470}"
NAME="${NAME:-${USER:-me}}"
DATA="${RELAY_DATA:-${XDG_DATA_HOME:-$HOME/.local/share}/switchboard/relay-lite}"

bash scripts/install-deps.sh
cargo build --release -p relay-lite -p switchboard-core
bin="$CARGO_TARGET_DIR/release"

mkdir -p "$DATA"
"$bin/relay-lite" --listen "127.0.0.1:$PORT" --data "$DATA" &
relay_pid=$!
trap 'kill $relay_pid 2>/dev/null || true' EXIT
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done

if ! "$bin/switchboard" whoami >/dev/null 2>&1; then
  "$bin/switchboard" init --name "$NAME" --relay "http://127.0.0.1:$PORT"
fi
"$bin/switchboard" whoami
echo
echo "runtime running; in another terminal try: switchboard status, switchboard contact add ADDRESS"
"$bin/switchboard" daemon
