#!/usr/bin/env bash
# Runs the benchmarks and prints each figure as a ratio against the baseline measured in the same
# run (2 noisy cores: ratios travel, absolute numbers do not). Paste the output into BENCHMARKS.md.
#   bash scripts/bench.sh            # everything
#   bash scripts/bench.sh crypto     # only the criterion benches in core
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/switchboard-target}"
what="${1:-all}"

if [ "$what" = all ] || [ "$what" = crypto ]; then
  cargo bench -p switchboard-core --bench letagents --bench store --bench stringcup --bench agent_mail -- --noplot >/dev/null
  python3 - "$CARGO_TARGET_DIR/criterion" <<'PY'
import json, sys, os
root = sys.argv[1]
def median(group, name):
    with open(os.path.join(root, group, name, "new", "estimates.json")) as f:
        return json.load(f)["median"]["point_estimate"]
rows = []
for size in ("1k", "16k"):
    g = f"letagents_{size}"
    for op in ("seal", "open"):
        subject, base = median(g, op), median(g, op + "_primitives")
        rows.append((f"letagents {op}, {size} message", subject, f"sum of primitives", base))
for size in ("1k", "16k"):
    for op in ("seal", "open"):
        subject, base = median(f"agent_mail_{size}", op), median(f"agent_mail_{size}", op + "_primitives")
        rows.append((f"agent mail {op}, {size} message", subject, "sum of primitives", base))
rows.append(("HPKE Base seal, 2 KiB (ours)", median("hpke_2k", "seal_this_crate"), "hpke crate", median("hpke_2k", "seal_hpke_crate")))
for op in ("seal", "open"):
    subject, base = median("stringcup_1k", op), median("stringcup_1k", op + "_primitives")
    rows.append((f"stringcup {op}, 1 KB text", subject, "sum of primitives", base))
subject, base = median("store", "receive_commit"), median("store", "bare_insert")
rows.append(("receive: open + decide + commit", subject, "bare SQLite insert (same pragmas)", base))
print("| measured | median | baseline (same run) | median | ratio |")
print("|---|---|---|---|---|")
for name, s, bname, b in rows:
    print(f"| {name} | {s/1000:.1f} µs | {bname} | {b/1000:.1f} µs | {s/b:.2f}× |")
PY
fi

if [ "$what" = all ] || [ "$what" = relay ]; then
  cargo bench -p relay-lite --bench relay_load
  cargo bench -p relay-lite --bench agent_mail_load
fi
