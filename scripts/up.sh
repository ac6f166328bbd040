#!/usr/bin/env bash
# The main job on a fresh machine: installs what is needed, builds, starts a relay-lite on
# loopback, creates the default profile (embedded SQLite) the first time and prints your address,
# then runs the profile's runtime: inside the desktop app when there is a display, otherwise the
# headless daemon serving the same UI to a browser (`switchboard ui` prints a sign-in link).
# Ctrl-C stops everything.
#
#   bash scripts/up.sh                 # relay on 127.0.0.1:8470, profile in the OS data dir
#   NAME=alice PORT=9000 bash scripts/up.sh
#   HEADLESS=1 bash scripts/up.sh      # never open the desktop app
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/switchboard-target}"
PORT="${PORT:-8470}"
NAME="${NAME:-${USER:-me}}"
DATA="${RELAY_DATA:-${XDG_DATA_HOME:-$HOME/.local/share}/switchboard/relay-lite}"

desktop=0
if [ -z "${HEADLESS:-}" ] && { [ -n "${DISPLAY:-}" ] || [ -n "${WAYLAND_DISPLAY:-}" ]; }; then desktop=1; fi

bash scripts/install-deps.sh
# The app is built headless too: the `switchboard` binary is then exactly the one the package ships.
bash scripts/build-release.sh
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
if [ "$desktop" = 1 ]; then
  echo "starting the desktop app (it embeds the runtime); the CLI and agents use it through its bridge"
  "$bin/switchboard-app"
else
  echo "runtime running; in another terminal try: switchboard ui (a browser sign-in link),"
  echo "switchboard status, switchboard contact add ADDRESS"
  "$bin/switchboard" daemon --ui "$PWD/ui/dist"
fi
