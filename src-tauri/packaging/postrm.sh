#!/bin/sh
# Drops the removed desktop entry's `switchboard:` link handler from the MIME cache.
set -e
if command -v update-desktop-database >/dev/null 2>&1; then
  update-desktop-database -q /usr/share/applications || true
fi
