#!/usr/bin/env bash
# Installs the .deb that scripts/package.sh made, checks what it installed, runs the installed
# commands and launches the installed app under Xvfb until its window shows (src-tauri/tests/
# window.rs pointed at /usr/bin/switchboard-app), checks the .rpm's file list, then removes the
# package again. Run as root (CI is root). PROFILE as for package.sh (CI: debug).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/switchboard-target}"
PROFILE="${PROFILE:-release}"
bundle="$CARGO_TARGET_DIR/$PROFILE/bundle"
deb="$(ls -1t "$bundle"/deb/*.deb | head -n1)"
rpm="$(ls -1t "$bundle"/rpm/*.rpm | head -n1)"
name="$(dpkg-deb -f "$deb" Package)"
echo "package $name: $(du -h "$deb" | cut -f1) deb, $(du -h "$rpm" | cut -f1) rpm"

fail() { echo "package test: $*" >&2; exit 1; }
dpkg -i "$deb" >/dev/null
trap 'dpkg -r "$name" >/dev/null 2>&1 || true' EXIT

desktop=""
for f in /usr/share/applications/*.desktop; do
  grep -q '^Exec=switchboard-app' "$f" && desktop="$f"
done
[ -n "$desktop" ] || fail "no desktop entry runs switchboard-app: $(dpkg -L "$name" | tr '\n' ' ')"
for f in /usr/bin/switchboard-app /usr/bin/switchboard /usr/bin/relay-lite; do
  [ -x "$f" ] || fail "$f missing"
done
# Lists are captured first: with pipefail, `cmd | grep -q` fails when grep exits at its first
# match and cmd is still writing (SIGPIPE); that failed CI once.
installed="$(dpkg -L "$name")"
grep -q '^/usr/share/icons/hicolor/.*/apps/.*\.png$' <<<"$installed" || fail "no icon installed"
grep -qx 'MimeType=x-scheme-handler/switchboard;' "$desktop" || fail "$desktop has no switchboard: handler"
grep -q '^Exec=switchboard-app %u$' "$desktop" || fail "$desktop does not pass the link to the app"
handler="$(XDG_CURRENT_DESKTOP=X-Generic xdg-mime query default x-scheme-handler/switchboard)"
[ "$handler" = "$(basename "$desktop")" ] || fail "switchboard: links open with '$handler', not $(basename "$desktop")"
switchboard --version
relay-lite --version
rpm_files="$(rpm -qpl "$rpm" 2>/dev/null)"
grep -qx /usr/bin/switchboard <<<"$rpm_files" || fail "the rpm lacks /usr/bin/switchboard"

# The installed app, started as a user would, until its window is mapped and painted.
SWITCHBOARD_APP_BIN=/usr/bin/switchboard-app cargo test --workspace --test window -- --nocapture 2>&1 \
  | grep -E '^test |spawn to first paint|test result' || fail "the installed app's window did not show"
dpkg -r "$name" >/dev/null
[ ! -e /usr/bin/switchboard ] || fail "dpkg -r left /usr/bin/switchboard"
trap - EXIT
echo "package test passed: installed, ran, window shown, removed"
