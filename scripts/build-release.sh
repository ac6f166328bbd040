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

# How much of the link order still applies: names change as the code does (see link-order.sh).
order=core/switchboard.order
bin="$CARGO_TARGET_DIR/release/switchboard"
if [ -f "$order" ] && command -v nm >/dev/null; then
  listed=$(grep -vc '^#' "$order" || true)
  found=$(grep -v '^#' "$order" | sort -u | comm -12 - <(nm --defined-only "$bin" | awk '{print $3}' | sort -u) | wc -l)
  echo "$order: $found of $listed functions found in $bin"
  if [ "$listed" -gt 0 ] && [ $((found * 100 / listed)) -lt 80 ]; then
    echo "warning: the link order is stale; remake it with: bash scripts/link-order.sh" >&2
  fi
fi
