#!/usr/bin/env bash
# Makes core/switchboard.order: the functions a running `switchboard daemon` executes, which
# core/build.rs has the linker place side by side, so the daemon's resident code is what it runs
# and not every 64 KB window of the binary that holds one of those functions (BENCHMARKS.md, "Idle
# `switchboard daemon` memory"). Rerun it when the daemon's idle memory creeps up after changes:
# names the list holds that a build no longer has are ignored, and new code lies outside the hot
# range until the list is made again.
#
#   bash scripts/link-order.sh           # the release build, then ~40 s of a daemon under callgrind
#   SECONDS_IDLE=60 bash scripts/link-order.sh
#
# The list holds mangled names, whose hashes change with the build's dependency features, so it is
# made from the build that ships, scripts/build-release.sh (scripts/up.sh and scripts/package.sh
# build with it too).
# The run: a relay-lite, two profiles (alice, bob); alice's daemon runs under
# `valgrind --tool=callgrind` while bob and alice become contacts, bob sends, alice reads her inbox
# and answers through her daemon and the everyday read-only commands go through it; then it idles
# for SECONDS_IDLE wall seconds (Agent Mail polls, followers, housekeeping) and stops on SIGTERM.
# Every function of the binary that ran is listed, in the binary's own address order.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/switchboard-target}"
SECONDS_IDLE="${SECONDS_IDLE:-30}"
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 2; }

bash scripts/build-release.sh
bin="$CARGO_TARGET_DIR/release"
work="$(mktemp -d)"
relay_pid=""
daemon_pid=""
cleanup() {
  [ -z "$daemon_pid" ] || kill "$daemon_pid" 2>/dev/null || true
  [ -z "$relay_pid" ] || kill "$relay_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
export SWITCHBOARD_KEYSTORE=file

"$bin/relay-lite" --listen 127.0.0.1:0 --data "$work/relay" >"$work/relay.out" 2>"$work/relay.err" &
relay_pid=$!
for _ in $(seq 100); do grep -q listening "$work/relay.out" 2>/dev/null && break; sleep 0.1; done
relay="$(sed -n 's/^relay-lite listening on //p' "$work/relay.out")"
[ -n "$relay" ] || { echo "relay-lite did not start" >&2; cat "$work/relay.err" >&2; exit 1; }

sb() { "$bin/switchboard" --home "$work/$1" "${@:2}"; }
link_of() { sb "$1" --json whoami | python3 -c 'import json,sys; print(json.load(sys.stdin)["contact_link"]["link"])'; }
sb alice init --name alice --relay "$relay" >/dev/null
sb bob init --name bob --relay "$relay" >/dev/null
alice_link="$(link_of alice)"
bob_link="$(link_of bob)"

valgrind --tool=callgrind --demangle=no --dump-instr=no --callgrind-out-file="$work/callgrind.out" \
  "$bin/switchboard" --home "$work/alice" daemon >"$work/daemon.out" 2>"$work/daemon.err" &
daemon_pid=$!
for _ in $(seq 1200); do [ -e "$work/alice/bridge.port" ] && break; sleep 0.1; done
[ -e "$work/alice/bridge.port" ] || { echo "the daemon did not start" >&2; cat "$work/daemon.err" >&2; exit 1; }

# A day's first minutes: contacts made both ways, a message each way, the inbox read.
sb alice contact add "$bob_link" --name bob >/dev/null          # through alice's daemon
sb bob contact add "$alice_link" --name alice >/dev/null
sb bob send alice "hello from bob" >/dev/null
sb alice inbox --wait 60 --json >/dev/null
sb alice send bob "hello from alice" >/dev/null
sb bob inbox --wait 60 --json >/dev/null
# What a user, the UI or an agent's harness reads from a running daemon.
for cmd in status "contact list" "contact requests" log settings policy "agent list" "review list" \
  "relay list" "group list" lan inbox whoami; do
  # shellcheck disable=SC2086  # the words of each command
  sb alice --json $cmd >/dev/null
done
sleep "$SECONDS_IDLE"
kill -TERM "$daemon_pid"
wait "$daemon_pid" || true
daemon_pid=""

python3 scripts/link_order.py make "$bin/switchboard" "$work/callgrind.out" core/switchboard.order
