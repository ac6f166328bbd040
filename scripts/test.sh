#!/usr/bin/env bash
# Runs every test: unit, end-to-end (real relay-lite, real profiles, real HTTP), the Secret Service
# keyring path against a real gnome-keyring, and bounded fuzzing of every untrusted-input parser.
# Expects scripts/install-deps.sh to have run (.ci/run does both).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/var/tmp/switchboard-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
FUZZ_SECONDS="${FUZZ_SECONDS:-20}"

echo "== build"
cargo build --workspace --all-targets

echo "== tests (inside a D-Bus session with an unlocked gnome-keyring)"
keyring_home="$(mktemp -d)"
dbus-run-session -- bash -c '
  set -euo pipefail
  echo -n switchboard-ci | HOME="$0" gnome-keyring-daemon --unlock --components=secrets >/dev/null
  export SWITCHBOARD_TEST_KEYRING=1
  export SWITCHBOARD_REQUIRE_CODEX=1  # tests/tests/codex.rs fails instead of skipping without codex
  export SWITCHBOARD_REQUIRE_CLAUDE=1  # tests/tests/claude_code.rs likewise without Claude Code
  export SWITCHBOARD_REQUIRE_WEBDRIVER=1  # src-tauri/tests/webview.rs likewise without tauri-driver
  export SWITCHBOARD_REQUIRE_MAIL=1  # relay-lite/tests/asnet_{smtp,postfix}.rs and tests/tests/asnet_client.rs likewise without aiosmtpd, Postfix or Dovecot
  export SWITCHBOARD_REQUIRE_POSTGRES=1  # relay-lite store_conformance and pg_cluster fail instead of skipping without PostgreSQL
  export SWITCHBOARD_REQUIRE_NETNS=1  # tests/tests/lan_netns.rs likewise without network namespaces (root, iproute2)
  export SWITCHBOARD_REQUIRE_TMPFS=1  # the disk-full tests (relay-lite, tests/) mount a small tmpfs: CI runs as root
  cargo test --workspace --no-fail-fast
' "$keyring_home"
rm -rf "$keyring_home"

echo "== package (.deb and .rpm of the debug build; installed, run, window shown, removed)"
if [ "$(id -u)" = 0 ]; then
  PROFILE=debug SKIP_DEPS=1 bash scripts/package.sh
  PROFILE=debug bash scripts/package-test.sh
elif [ -n "${CI:-}" ]; then
  echo "the package test installs a .deb: run as root" >&2
  exit 1
else
  echo "skipped: the package test installs a .deb and needs root"
fi

echo "== fuzz (${FUZZ_SECONDS}s per target)"
if ! command -v cargo-fuzz >/dev/null; then
  cargo install cargo-fuzz --locked --quiet
fi
(
  cd fuzz
  export CARGO_TARGET_DIR=/var/tmp/switchboard-fuzz-target
  for target in $(RUSTC_BOOTSTRAP=1 cargo fuzz list); do
    mkdir -p "corpus/$target"
    [ -d "seeds/$target" ] && cp -n "seeds/$target"/* "corpus/$target/" 2>/dev/null || true
    echo "-- $target"
    log="$(mktemp)"
    if ! RUSTC_BOOTSTRAP=1 cargo fuzz run "$target" "corpus/$target" -- \
      -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
      tail -n 60 "$log"
      echo "fuzz target $target failed" >&2
      exit 1
    fi
    grep -E "number_of_executed_units|new_units_added" "$log" || true
    rm -f "$log"
  done
)
echo "all tests passed"
