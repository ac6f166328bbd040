#!/usr/bin/env bash
# Builds the installable packages with Tauri's bundler: a .deb and an .rpm holding the desktop
# app (/usr/bin/switchboard-app), the `switchboard` command (CLI, daemon, MCP server) and
# `relay-lite`, the desktop entry with its `x-scheme-handler/switchboard` link handler, and icons.
#
#   bash scripts/package.sh                  # release build; packages in $CARGO_TARGET_DIR/release/bundle/{deb,rpm}
#   PROFILE=debug bash scripts/package.sh    # CI: packages the debug build the tests already made
#
# The bundler is the npm package @tauri-apps/cli (ui/node_modules, installed by install-deps.sh);
# neither bundle downloads anything. The extra commands are Tauri "external binaries", staged in
# src-tauri/binaries/ under the host triple; the bundling settings live in
# src-tauri/tauri.bundle.conf.json so a plain `cargo build` does not need those files.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/switchboard-target}"
PROFILE="${PROFILE:-release}"

[ -n "${SKIP_DEPS:-}" ] || bash scripts/install-deps.sh
case "$PROFILE" in
  # The test build (--all-targets) unifies dev-dependency features; building --bins alone would
  # rebuild the app with other features, so reuse it exactly (a no-op after scripts/test.sh).
  debug) cargo build --workspace --all-targets; debug=(--debug) ;;
  release) bash scripts/build-release.sh; debug=() ;;
  *) echo "PROFILE must be release or debug" >&2; exit 2 ;;
esac

triple="$(rustc -vV | sed -n 's/^host: //p')"
mkdir -p src-tauri/binaries
for bin in switchboard relay-lite; do
  cp "$CARGO_TARGET_DIR/$PROFILE/$bin" "src-tauri/binaries/$bin-$triple"
done
rm -rf "$CARGO_TARGET_DIR/$PROFILE/bundle"
(cd src-tauri && ../ui/node_modules/.bin/tauri bundle --ci "${debug[@]}" --bundles deb,rpm --config tauri.bundle.conf.json)
ls -1 "$CARGO_TARGET_DIR/$PROFILE"/bundle/deb/*.deb "$CARGO_TARGET_DIR/$PROFILE"/bundle/rpm/*.rpm
