#!/bin/sh
# Registers the desktop entry's `switchboard:` link handler with the desktop's MIME cache.
set -e
if command -v update-desktop-database >/dev/null 2>&1; then
  update-desktop-database -q /usr/share/applications || true
fi
