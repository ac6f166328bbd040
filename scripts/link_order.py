"""The link order's two uses of a binary's symbol table (`nm`), in one place.

    python3 scripts/link_order.py make BINARY CALLGRIND_OUT ORDER_FILE   # scripts/link-order.sh
    python3 scripts/link_order.py check ORDER_FILE BINARY                # scripts/build-release.sh

`make` writes the functions of BINARY that ran in the callgrind profile, in the binary's address
order. `check` says how many of the listed functions BINARY still has and whether they lie
together, warning when the list is stale or the binary was not ordered (core/build.rs).
"""

import re
import subprocess
import sys


def functions(binary):
    """(address, size, name) of every function BINARY defines, in address order."""
    out = subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTwW":
            rows.append((int(parts[0], 16), int(parts[1], 16), parts[3]))
    return sorted(rows)


def make(binary, profile, order):
    ran = set()
    for line in open(profile, encoding="utf-8", errors="replace"):
        m = re.match(r"c?fn=\(\d+\) (.+)$", line.rstrip("\n"))
        if m:
            ran.add(m.group(1))
    rows = [r for r in functions(binary) if r[2] in ran]
    names = list(dict.fromkeys(r[2] for r in rows))
    with open(order, "w") as f:
        f.write("# Functions a running `switchboard daemon` executed, for the linker (core/build.rs).\n")
        f.write("# Made by scripts/link-order.sh from the release build; do not edit.\n")
        f.writelines(n + "\n" for n in names)
    print(f"{order}: {len(names)} functions, {sum(r[1] for r in rows) / 1e6:.2f} MB of code")


def check(order, binary):
    listed = {l.strip() for l in open(order) if l.strip() and not l.startswith("#")}
    rows = [r for r in functions(binary) if r[2] in listed]
    names = {r[2] for r in rows}
    code = sum(s for _, s, _ in rows)
    span = max(a + s for a, s, _ in rows) - min(a for a, _, _ in rows) if rows else 0
    print(f"{order}: {len(names)} of {len(listed)} functions found in {binary}, {code / 1e6:.1f} MB of code lying in {span / 1e6:.1f} MB")
    if len(names) * 100 < 80 * len(listed):
        print("warning: the link order is stale; remake it with: bash scripts/link-order.sh", file=sys.stderr)
    if span > 2 * code:
        print("warning: the listed functions are not laid out together (not linked with the toolchain's LLD? see core/build.rs)", file=sys.stderr)


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"make": make, "check": check}[command](*args)
