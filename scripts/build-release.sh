#!/usr/bin/env bash
# The release build of everything Switchboard ships: relay-lite, the `switchboard` command and the
# desktop app, in one cargo invocation so that the dependencies' features, and with them the
# symbol names in core/switchboard.order, are the same for scripts/up.sh, scripts/package.sh and
# scripts/link-order.sh (a narrower selection unifies a dozen crates' features differently, which
# renames most of the binary's functions).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/switchboard-target}"
cargo build --release -p relay-lite -p switchboard-core -p switchboard-app "$@"

# Whether the link order applied (core/build.rs) and how much of it: names change as the code does
# (see link-order.sh), and a build linked without LLD is not ordered at all.
order=core/switchboard.order
bin="$CARGO_TARGET_DIR/release/switchboard"
if [ -f "$order" ] && command -v nm >/dev/null && command -v python3 >/dev/null; then
  python3 scripts/link_order.py check "$order" "$bin"
fi
