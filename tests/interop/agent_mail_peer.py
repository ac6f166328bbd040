#!/usr/bin/env python3
"""The published Agent Mail SDK (PyPI `agent-protocols`) as a peer of a Switchboard profile.

    python3 agent_mail_peer.py <relay_origin> <relay_cert_pem> <switchboard_mail_address>

Over HTTPS to relay-lite (its self-signed certificate trusted as the only CA, verification on),
the SDK's MailClient publishes a card for a fresh mailbox and prints `ADDRESS <contact address>`,
fetches and pins the Switchboard card, sends one message (subject `interop`, our card as reply
card) and prints `PACKET <packet JCS>` and `MESSAGE <message_id> <thread_id>`. It then lists its
mailbox with owner request JWTs until Switchboard's reply arrives, decrypts it, checks the reply
bindings (parties swapped, in_reply_to, thread) and the reply card, deletes the packet, prints
`REPLY <text>` and `SUBJECT <subject>` and exits 0. Any failure exits non-zero with `FAIL ...` on
stderr. Run by tests/tests/agent_mail_interop.rs.
"""

import json
import sys
import time

try:
    import requests
    from requests.adapters import HTTPAdapter
    from agent_protocols.http_client import MailClient
    from agent_protocols.identity import AgentSigner, ClientNonceManager
    from agent_protocols.mail import (
        MailEncryptionKey, _jcs, create_mail_message, decode_mail_part, decrypt_mail, encrypt_mail,
        format_mail_address, mail_part, mailbox_publish_event, new_mail_id, parse_mail_address,
        sign_mail_event, validate_mail_reply, validate_mailbox_card,
    )
except ImportError as exc:  # pragma: no cover
    sys.stderr.write("FAIL: cannot import agent_protocols (%s); run scripts/install-deps.sh\n" % exc)
    sys.exit(2)

DAY = 86_400_000


class TrustRelayCert(HTTPAdapter):
    """Verifies TLS against the relay's own certificate (not the system roots) instead of
    turning verification off: MailClient asks for verify=True on every request."""

    def __init__(self, cert_path):
        super().__init__()
        self.cert_path = cert_path

    def send(self, request, **kwargs):
        kwargs["verify"] = self.cert_path
        return super().send(request, **kwargs)


def now_ms():
    return int(time.time() * 1000)


def main(origin, cert_path, peer_address):
    session = requests.Session()
    session.mount("https://", TrustRelayCert(cert_path))
    client = MailClient(origin, session=session)
    client.protocol()

    signer = AgentSigner.generate()
    me = signer.agent_id()
    nonces = ClientNonceManager()
    key = MailEncryptionKey.generate()
    mailbox = new_mail_id()
    now = now_ms()
    payload = {
        "mailbox_id": mailbox,
        "expires_at": now + DAY,
        "receive_until": now + 2 * DAY,
        "public_key": key.public_key(),
        "routes": [origin],
        "max_packet_bytes": 65536,
    }
    card = sign_mail_event(signer, mailbox_publish_event(me, now, nonces.next_nonce(now), payload))
    client.publish(card)
    print("ADDRESS %s" % format_mail_address(me, mailbox, [origin]), flush=True)

    peer = parse_mail_address(peer_address)
    record = client.card(peer["mailbox_id"], peer["owner"])
    peer_card = record["envelope"]
    now = now_ms()
    message = create_mail_message(me, now, {
        "to": peer["owner"],
        "expires_at": now + DAY,
        "thread_id": new_mail_id(),
        "subject": "interop",
        "parts": [mail_part("text/plain", "hello from the agent-protocols SDK")],
        "reply_card": card,
    })
    packet = encrypt_mail(message, peer_card, signer, nonces.next_nonce(now_ms()))
    client.deliver(packet)
    print("PACKET %s" % _jcs(packet).decode(), flush=True)
    print("MESSAGE %s %s" % (message["message_id"], message["thread_id"]), flush=True)

    def jwt():
        t = int(time.time())
        return signer.sign_request_jwt({"iss": me, "sub": me, "aud": origin, "iat": t - 5, "exp": t + 60})

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for page in client.pages(mailbox, me, jwt):
            for rec in page["result"]:
                reply = decrypt_mail(rec["packet"], card, key, me, packet_id=rec["packet_id"])
                validate_mail_reply(reply, message)
                validate_mailbox_card(reply["reply_card"], peer["owner"])
                client.delete(mailbox, rec["packet_id"], me, jwt())
                text = "".join(decode_mail_part(p).decode() for p in reply["parts"])
                print("REPLY %s" % text, flush=True)
                print("SUBJECT %s" % reply.get("subject", ""), flush=True)
                return 0
        time.sleep(0.3)
    sys.stderr.write("FAIL: no reply from %s within 60 s\n" % peer["owner"])
    return 1


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.stderr.write("usage: agent_mail_peer.py <relay_origin> <relay_cert_pem> <switchboard_mail_address>\n")
        sys.exit(2)
    try:
        sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3]))
    except Exception as exc:  # noqa: BLE001 - report every failure with its SDK error code
        sys.stderr.write("FAIL: %s: %s\n" % (type(exc).__name__, getattr(exc, "args", exc)))
        sys.exit(1)
