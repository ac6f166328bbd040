#!/usr/bin/env python3
"""The published Stringcup reference client (PyPI `stringcup`) as a peer of a Switchboard profile.

    python3 stringcup_peer.py <base_url> <switchboard_stringcup_id>

Registers an agent named `pyagent`, prints `ID <its id>`, sends `hello from python` to the
Switchboard identity, then long-polls until that identity answers, prints `REPLY <text>`, acks
and exits 0. Any failure exits non-zero with `FAIL ...` on stderr. Run by
tests/tests/stringcup_interop.rs.
"""

import os
import sys
import tempfile
import time

try:
    from stringcup import Client
except ImportError as exc:  # pragma: no cover
    sys.stderr.write("FAIL: cannot import stringcup (%s); run scripts/install-deps.sh\n" % exc)
    sys.exit(2)


def main(base_url, peer):
    with tempfile.TemporaryDirectory(prefix="sc-peer-") as work:
        client = Client.load_or_register(
            os.path.join(work, "identity.json"), base_url=base_url, display_name="pyagent", transcript=None
        )
        print("ID %s" % client.id, flush=True)
        client.send(peer, "hello from python")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            page = client.fetch(limit=50, wait=20)
            for message in page.messages:
                if message.sender_id == peer:
                    client.ack([m.id for m in page.messages])
                    print("REPLY %s" % message.text, flush=True)
                    return 0
            if page.messages:
                client.ack([m.id for m in page.messages])
        sys.stderr.write("FAIL: no reply from %s within 60 s\n" % peer)
        return 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.stderr.write("usage: stringcup_peer.py <base_url> <switchboard_stringcup_id>\n")
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
