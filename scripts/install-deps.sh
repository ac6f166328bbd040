#!/usr/bin/env bash
# Installs the system packages Switchboard builds and tests with (Debian 12). Idempotent: does
# nothing when everything is already there. Run as root (CI is root), or with sudo.
set -euo pipefail

packages=(
  build-essential pkg-config curl ca-certificates   # C toolchain for ring and the bundled SQLite
  dbus dbus-user-session gnome-keyring libsecret-tools  # a real Secret Service for keyring tests
  procps psmisc                                      # pgrep/pkill in scripts
  chromium                                           # the UI's end-to-end test (ui/e2e, playwright-core)
  libwebkit2gtk-4.1-dev libxdo-dev libssl-dev libayatana-appindicator3-dev librsvg2-dev  # the Tauri app
  xvfb xauth x11-utils xdotool imagemagick           # the app's window test (src-tauri/tests/window.rs)
  dunst                                              # a real notification server (src-tauri/tests/notifications.rs)
  trayer                                             # a real system tray (XEmbed) for the close-to-tray tests (src-tauri/tests/tray.rs, webview.rs)
  webkit2gtk-driver python3                          # WebKitWebDriver, behind tauri-driver (src-tauri/tests/webview.rs)
  iproute2                                           # network namespaces for the LAN tests (tests/tests/lan_netns.rs)
  xdg-utils desktop-file-utils rpm                   # the package test: link handler, MIME cache, the .rpm's file list
  python3-aiosmtpd                                   # a real SMTP receiver as the ASNET smarthost (relay-lite/tests/asnet_smtp.rs)
  postfix                                            # a real MTA in front of the ASNET service (relay-lite/tests/asnet_postfix.rs)
  dovecot-imapd                                      # a real IMAP server the ASNET client reads its replies from (tests/tests/asnet_client.rs)
  postgresql                                         # relay-lite's PostgreSQL backend tests (initdb + pg_ctl in a temp dir)
)

missing=()
for p in "${packages[@]}"; do
  [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # Postfix unconfigured and not started: the test runs its own loopback-only instance.
  echo "postfix postfix/main_mailer_type select No configuration" | $SUDO debconf-set-selections
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "cargo is not installed: install Rust (rustup) first" >&2
  exit 1
fi
grep -q clippy <<<"$(rustup component list --installed 2>/dev/null)" || rustup component add clippy rustfmt >/dev/null 2>&1 || true

# tauri-driver (src-tauri/tests/webview.rs drives the real app's webview over WebDriver through it
# and WebKitWebDriver), skipped when this exact version is installed; the test fails, never skips,
# under SWITCHBOARD_REQUIRE_WEBDRIVER=1 when it is missing.
tauri_driver_version=2.0.6
# (lists are captured before grep -q: with pipefail a grep that exits early fails the pipe)
if ! grep -qx "tauri-driver v$tauri_driver_version:" <<<"$(cargo install --list 2>/dev/null)"; then
  (cd / && env -u CARGO_TARGET_DIR cargo install tauri-driver --version "$tauri_driver_version" --locked --quiet)
fi


# Python packages the interop tests drive, pip-installed into the python3 first on PATH (the one
# the tests run), each skipped when that exact version is already there; the tests fail, never
# skip, when one is missing. The PIP_* variables let root install into a Debian system python
# (PEP 668) and are ignored by a pip without them.
#   stringcup: the published Stringcup reference client (relay-lite/tests/stringcup_interop.rs,
#              tests/tests/stringcup_interop.rs)
#   mcp:       the reference MCP SDK, the client of `switchboard mcp` in tests/tests/mcp.rs
#   agent-protocols (+ requests, its `http` extra): the published Agent Mail SDK whose MailClient
#              talks to relay-lite and a Switchboard profile in tests/tests/agent_mail_interop.rs
pip_install() {
  local name=$1 version=$2
  python3 -c "import importlib.metadata as m, sys; sys.exit(m.version('$name') != '$version')" 2>/dev/null && return 0
  if ! python3 -m pip --version >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
    python3 -m pip install --quiet "$name==$version"
}
pip_install stringcup 3.38.0
pip_install mcp 2.3.0
pip_install requests 2.34.2
pip_install agent-protocols 0.12.6

# The Codex CLI (tests/tests/codex.rs drives its real `codex app-server` through `switchboard
# codex`): npm's Linux x64 build of @openai/codex, unpacked outside the clone. The test looks for
# $SWITCHBOARD_CODEX_BIN, then this path, and fails (never skips) under SWITCHBOARD_REQUIRE_CODEX=1.
codex_version=0.171.0
codex_dir=/var/tmp/switchboard-codex/$codex_version
if [ "$(uname -m)" = x86_64 ] && [ ! -x "$codex_dir/package/vendor/x86_64-unknown-linux-musl/bin/codex" ]; then
  if ! command -v npm >/dev/null; then
    SUDO=""
    [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  rm -rf "$codex_dir" && mkdir -p "$codex_dir"
  (cd "$codex_dir" && npm pack --silent "@openai/codex@$codex_version-linux-x64" >/dev/null \
    && tar xzf "openai-codex-$codex_version-linux-x64.tgz" && rm -f "openai-codex-$codex_version-linux-x64.tgz")
fi

# The UI (ui/): `npm ci` from the committed lockfile, then the build that the bridge serves and the
# Tauri app embeds (ui/dist; `generate_context!` needs it). Each step is skipped when done already.
(
  cd "$(dirname "$0")/../ui"
  if [ ! -d node_modules ] || ! cmp -s package-lock.json node_modules/.switchboard-lock; then
    npm ci --no-audit --no-fund --loglevel=error
    cp package-lock.json node_modules/.switchboard-lock
  fi
  if [ ! -f dist/index.html ] || [ -n "$(find src index.html package-lock.json vite.config.ts tsconfig.json \
      -newer dist/index.html -print -quit)" ]; then
    npm run build --silent >/dev/null
  fi
)

# Claude Code (tests/tests/claude_code.rs loads adapters/claude-code into `claude -p`): npm's Linux
# x64 build of @anthropic-ai/claude-code, unpacked outside the clone; the test looks for
# $SWITCHBOARD_CLAUDE_BIN, then this path, and fails (never skips) under SWITCHBOARD_REQUIRE_CLAUDE=1.
claude_version=2.1.332
claude_dir=/var/tmp/switchboard-claude/$claude_version
if [ "$(uname -m)" = x86_64 ] && [ ! -x "$claude_dir/package/claude" ]; then
  rm -rf "$claude_dir" && mkdir -p "$claude_dir"
  (cd "$claude_dir" && npm pack --silent "@anthropic-ai/claude-code-linux-x64@$claude_version" >/dev/null \
    && tar xzf "anthropic-ai-claude-code-linux-x64-$claude_version.tgz" \
    && rm -f "anthropic-ai-claude-code-linux-x64-$claude_version.tgz")
fi
