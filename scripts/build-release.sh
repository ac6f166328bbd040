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
  python3 - "$order" "$bin" <<'PY'
import subprocess, sys
order, binary = sys.argv[1:]
listed = {l.strip() for l in open(order) if l.strip() and not l.startswith("#")}
names, spans = set(), []
for line in subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True, text=True, check=True).stdout.splitlines():
    p = line.split()
    if len(p) == 4 and p[3] in listed:
        names.add(p[3])
        spans.append((int(p[0], 16), int(p[1], 16)))
code = sum(s for _, s in spans)
span = max(a + s for a, s in spans) - min(a for a, _ in spans) if spans else 0
print(f"{order}: {len(names)} of {len(listed)} functions found in {binary}, {code / 1e6:.1f} MB of code lying in {span / 1e6:.1f} MB")
if len(names) * 100 < 80 * len(listed):
    print("warning: the link order is stale; remake it with: bash scripts/link-order.sh", file=sys.stderr)
if span > 2 * code:
    print("warning: the listed functions are not laid out together (not linked with the toolchain's LLD? see core/build.rs)", file=sys.stderr)
PY
fi
