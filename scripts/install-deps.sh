#!/usr/bin/env bash
# Installs the system packages Switchboard builds and tests with (Debian 12). Idempotent: does
# nothing when everything is already there. Run as root (CI is root), or with sudo.
set -euo pipefail

packages=(
  build-essential pkg-config curl ca-certificates   # C toolchain for ring and the bundled SQLite
  dbus dbus-user-session gnome-keyring libsecret-tools  # a real Secret Service for keyring tests
  procps psmisc                                      # pgrep/pkill in scripts
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "cargo is not installed: install Rust (rustup) first" >&2
  exit 1
fi
rustup component list --installed 2>/dev/null | grep -q clippy || rustup component add clippy rustfmt >/dev/null 2>&1 || true
