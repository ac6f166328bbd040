#!/usr/bin/env python3
"""Drives the PUBLISHED Stringcup reference client (PyPI `stringcup`, 3.38.0) against a relay.

    python3 stringcup_client.py <base_url> <scenario>

`base_url` is the relay's API base, e.g. `http://127.0.0.1:PORT/api/v2`. Every scenario uses
the client's public surface (plus `_request` and `_budgets` where it has no public one),
registers its own identities in a temporary directory, and exits 0 on success. On any failure
it prints `FAIL <scenario>: <what>` (and the traceback) on stderr and exits 1.

Run by relay-lite/tests/stringcup_interop.rs, which starts relay-lite in-process with the limits
each scenario needs. Scenarios: see SCENARIOS at the bottom.
"""

import json
import os
import sys
import tempfile
import threading
import time
import traceback
import urllib.request

try:
    import stringcup
    from stringcup import (
        AuthError,
        Client,
        MessageTooLarge,
        NotFoundError,
        RateLimited,
        RecipientInboxFull,
        StringcupError,
        TrustStore,
        ValidationError,
    )
except ImportError as exc:  # pragma: no cover
    sys.stderr.write(
        "FAIL: cannot import the reference client (%s); run scripts/install-deps.sh "
        "(it pip-installs stringcup==3.38.0 into the python3 first on PATH)\n" % exc
    )
    sys.exit(2)

EXPECTED_DIST = "3.38.0"


class Failure(Exception):
    pass


def check(condition, what):
    if not condition:
        raise Failure(what)


def equal(actual, expected, what):
    if actual != expected:
        raise Failure("%s: expected %r, got %r" % (what, expected, actual))


def raises(kind, fn, what):
    """Calls fn and returns the exception, which must be a `kind`."""
    try:
        fn()
    except kind as exc:
        return exc
    except Exception as exc:  # noqa: BLE001
        raise Failure("%s: expected %s, got %s: %s" % (what, kind.__name__, type(exc).__name__, exc))
    raise Failure("%s: expected %s, nothing was raised" % (what, kind.__name__))


class Run:
    """One scenario's relay address, scratch directory and registered agents."""

    def __init__(self, base_url, work):
        self.base_url = base_url
        self.work = work

    def agent(self, name, trust=True, transcript=True):
        """Registers through load_or_register, as the client's docs tell agents to."""
        directory = os.path.join(self.work, name)
        kwargs = {}
        if trust:
            kwargs["trust_store"] = TrustStore(os.path.join(directory, "trust_store.json"))
        if not transcript:
            kwargs["transcript"] = None
        client = Client.load_or_register(
            os.path.join(directory, "identity.json"),
            base_url=self.base_url,
            display_name=name,
            **kwargs
        )
        equal(client.identity_source, "registered", "%s identity source" % name)
        check(client.id.startswith("sc-") and len(client.id) == 27, "assigned id %r" % client.id)
        return client

    def identity_path(self, client_name):
        return os.path.join(self.work, client_name, "identity.json")

    def raw(self, method, path, body=None, token=None):
        """A bare request, for checks the library does not wrap: (status, headers, json)."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", "Bearer " + token)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                raw = response.read()
                return response.status, response.headers, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
            return exc.code, exc.headers, parsed


def later(delay, fn):
    """Runs fn on a thread after `delay` seconds; join() re-raises its exception."""
    box = {}

    def body():
        time.sleep(delay)
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001
            box["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()

    def join(timeout=120):
        thread.join(timeout)
        check(not thread.is_alive(), "background call did not finish")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    return join


def transcript_records(client):
    if not client.transcript or not os.path.exists(client.transcript):
        return []
    with open(client.transcript, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


# ---- scenarios ----------------------------------------------------------------------------


def scenario_info(run):
    """The library's own version guards, and the relay's advertised limits it relies on."""
    import importlib.metadata

    equal(importlib.metadata.version("stringcup"), EXPECTED_DIST, "installed distribution")
    equal(stringcup.__dist_version__, EXPECTED_DIST, "stringcup.__dist_version__")
    stringcup.require_version("3.30.0")
    stringcup.require_features(*sorted(stringcup.FEATURES))
    status, _, info = run.raw("GET", "")
    equal(status, 200, "GET /api/v2")
    equal(info.get("version"), 2, "advertised protocol version")
    equal(info.get("algo"), stringcup.ALGO, "advertised algorithm")
    # The client hard-codes these ceilings; the relay must not advertise anything tighter.
    check(info.get("long_poll_max_wait_seconds", 0) >= stringcup.MAX_WAIT, "long-poll ceiling %r" % info)
    check(info.get("inbox_page_max", 0) >= stringcup.MAX_PAGE, "page ceiling %r" % info)
    check(info.get("ack_max_ids", 0) >= stringcup.MAX_ACK_BATCH, "ack ceiling %r" % info)
    check(info.get("batch_max_messages", 0) >= stringcup.MAX_BATCH, "batch ceiling %r" % info)
    check(info.get("message_max_bytes", 0) > 0, "message_max_bytes advertised")


def scenario_messaging(run):
    """Register, look up, send, long-poll, decrypt, ack; paging and redelivery."""
    alice, bob = run.agent("alice"), run.agent("bob")

    # Lookup, with the fingerprint recomputed locally and pinned on first sight.
    peer = alice.peer_info(bob.id)
    equal(peer["id"], bob.id, "peer_info id")
    equal(peer["identity_public_key"], bob.identity.public_key_b64, "peer_info key")
    equal(peer["display_name"], "bob", "peer_info display_name")
    equal(alice.peer_public_key(bob.id), bob.identity.public_key_b64, "peer_public_key")
    equal(alice.trust_store.get(bob.id), bob.my_fingerprint, "pinned on first sight")
    raises(NotFoundError, lambda: alice.peer_info("sc-" + "a" * 24), "lookup of an unknown id")

    # A fetch that waits is parked and woken by the send.
    started = time.monotonic()
    send = later(1.0, lambda: alice.send(bob.id, "hello bob"))
    page = bob.fetch(limit=10, wait=20)
    held = time.monotonic() - started
    seq = send()
    check(isinstance(seq, int) and seq >= 1, "sent_seq %r" % seq)
    equal(page.long_poll, "waited", "X-Long-Poll of a held fetch")
    check(0.8 <= held < 15, "the hold ended %.2fs after it started (the send was at 1s)" % held)
    equal([m.text for m in page.messages], ["hello bob"], "decrypted page")
    message = page.messages[0]
    equal(message.sender_id, alice.id, "sender_id")
    equal(message.recipient_id, bob.id, "recipient_id")
    equal(message.channel, None, "a direct message has no channel")
    check(message.created_at, "created_at present")
    equal(page.undecryptable, [], "undecryptable")
    equal(page.has_more, False, "has_more")
    equal(page.next_since_id, message.id, "next_since_id")

    # Not acknowledged yet: fetched again (at-least-once), then acked.
    equal([m.id for m in bob.fetch().messages], [message.id], "redelivered before the ack")
    acked = bob.ack([message.id])
    equal(acked["acknowledged"], [message.id], "ack")
    equal(bob.ack([message.id])["not_found"], [message.id], "a second ack is not_found, not an error")
    equal(bob.fetch().count, 0, "inbox empty after the ack")
    equal(bob.fetch(wait=1).long_poll, "waited", "an empty hold still reports waited")
    equal(bob.fetch().long_poll, "off", "no wait, no hold")

    # receive_one blocks, acknowledges and returns.
    send = later(0.5, lambda: bob.send(alice.id, "hello alice"))
    got = alice.receive_one(timeout=20)
    send()
    check(got is not None, "receive_one returned nothing")
    equal((got.sender_id, got.text), (bob.id, "hello alice"), "receive_one")
    equal(alice.fetch().count, 0, "receive_one acknowledged")
    equal(alice.receive_one(timeout=1), None, "receive_one on an empty inbox times out with None")

    # A backlog: paging with limit/since_id, receive_many, drain.
    texts = ["burst %d" % i for i in range(5)]
    seqs = [alice.send(bob.id, t) for t in texts]
    equal(seqs, sorted(seqs), "sent_seq grows")
    first = bob.fetch(limit=2)
    equal([m.text for m in first.messages], texts[:2], "first page")
    equal(first.has_more, True, "has_more on a partial page")
    second = bob.fetch(limit=2, since_id=first.next_since_id)
    equal([m.text for m in second.messages], texts[2:4], "second page")
    many = bob.receive_many(limit=3, timeout=10)
    equal([m.text for m in many.messages], texts[:3], "receive_many")
    equal(many.has_more, True, "receive_many keeps has_more")
    seen = []
    equal(bob.drain(lambda m: seen.append(m.text)), 2, "drain count")
    equal(seen, texts[3:], "drain order")
    equal(bob.fetch().count, 0, "drained")

    # receive() + ack_all(), and DELETE through the raw API.
    alice.send(bob.id, "one")
    alice.send(bob.id, "two")
    equal([m.text for m in bob.receive()], ["one", "two"], "receive")
    equal(len(bob.ack_all()["acknowledged"]), 2, "ack_all")
    alice.send(bob.id, "three")
    third = bob.fetch().messages[0]
    status, _, body = run.raw("DELETE", "/messages/%d" % third.id, token=bob.identity.api_token)
    equal(status, 200, "DELETE /messages/{id}")
    equal(body.get("message_id"), third.id, "DELETE answer")

    # A message to self, and UTF-8 / empty text.
    alice.send(alice.id, "to myself \u2713")
    bob.send(alice.id, "")
    texts = [m.text for m in alice.receive_many(limit=10, timeout=5).messages]
    equal(texts, ["to myself \u2713", ""], "self and empty messages")

    # The transcript recorded both directions.
    records = transcript_records(alice)
    check(any(r["direction"] == "out" and r["text"] == "hello bob" for r in records), "transcript out")
    check(any(r["direction"] == "in" and r["text"] == "hello alice" for r in records), "transcript in")

    # Recovery helpers built on the same calls.
    alice.send(bob.id, "where were we?")
    barrier = bob.sync_barrier(alice.id)
    equal((barrier["drained"], barrier["last_line"]), (1, "where were we?"), "sync_barrier")
    heard = []
    send = later(0.5, lambda: alice.send(bob.id, "for the listener"))
    bob.listen(heard.append, wait=5, idle_timeout=15, stop=lambda: bool(heard))
    send()
    equal([m.text for m in heard], ["for the listener"], "listen")

    # An unknown recipient and the sender_id rule; refusals keep the relay's body, reason included.
    exc = raises(NotFoundError, lambda: alice.send("sc-" + "b" * 24, "nobody"), "send to an unknown id")
    equal((exc.status, (exc.body or {}).get("error")), (404, "not_found"), "404 body")
    exc = raises(ValidationError, lambda: alice.peer_info("bob"), "lookup of a malformed id")
    check("sc-" in (exc.body or {}).get("message", ""), "400 body: %r" % exc.body)
    payload = stringcup.encrypt(alice.id, bob.id, bob.identity.public_key_b64, "forged")
    payload["recipient_id"] = bob.id
    payload["sender_id"] = bob.id
    status, _, body = run.raw("POST", "/messages", payload, token=alice.identity.api_token)
    equal(status, 403, "a sender_id that is not the token's identity")
    equal(body.get("error"), "forbidden", "error code for a foreign sender_id")
    equal(bob.fetch().count, 0, "the forged message was not stored")

    # Mail sealed to the wrong key is delivered, reported as undecryptable, and ackable.
    stranger_key = stringcup.Identity.generate().public_key_b64
    payload = stringcup.encrypt(alice.id, bob.id, stranger_key, "not for bob's key")
    payload["recipient_id"] = bob.id
    alice._request("POST", "/messages", payload)
    page = bob.fetch()
    equal((page.count, page.messages, len(page.undecryptable)), (1, [], 1), "undecryptable mail")
    equal(bob.ack(page.undecryptable)["acknowledged"], page.undecryptable, "undecryptable mail acked")


def scenario_idempotency(run):
    """The client's Idempotency-Key: a retry with the same key stores once."""
    alice, bob = run.agent("alice"), run.agent("bob")
    first = alice.send(bob.id, "exactly once", idempotency_key="retry-key-1")
    # A retry re-encrypts (fresh ephemeral key) under the same key: the relay answers the
    # original sent_seq and stores nothing new.
    again = alice.send(bob.id, "exactly once", idempotency_key="retry-key-1")
    equal(again, first, "replayed sent_seq")
    other = alice.send(bob.id, "a different message")
    check(other > first, "a fresh key stores a new message")
    page = bob.fetch(limit=50)
    equal([m.text for m in page.messages], ["exactly once", "a different message"], "stored once")

    # Through the transport directly: 201 then 200 with idempotent_replay.
    payload = stringcup.encrypt(alice.id, bob.id, bob.identity.public_key_b64, "raw")
    payload["recipient_id"] = bob.id
    payload["sender_id"] = alice.id
    body = alice._request("POST", "/messages", payload, idempotency_key="retry-key-2")
    equal(body.get("status"), "stored", "first send")
    replay = alice._request("POST", "/messages", payload, idempotency_key="retry-key-2")
    equal(replay.get("idempotent_replay"), True, "replay flag")
    equal(replay.get("sent_seq"), body.get("sent_seq"), "replay sent_seq")

    # The same key for another recipient is refused with 422 (not a silent "stored").
    carol = run.agent("carol")
    exc = raises(StringcupError, lambda: alice.send(carol.id, "x", idempotency_key="retry-key-1"), "key reuse")
    equal(exc.status, 422, "status of a key reused for another recipient")

    # Concurrent retries of one key: exactly one stored, everyone gets the same sent_seq
    # (409 is retried by the client with backoff).
    results, errors = [], []

    def worker():
        try:
            results.append(alice.send(carol.id, "concurrent", idempotency_key="retry-key-3", retries=8))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    equal(errors, [], "concurrent retries")
    equal(len(set(results)), 1, "one sent_seq for all retries %r" % results)
    equal([m.text for m in carol.fetch().messages], ["concurrent"], "stored exactly once")


def pair(run, with_secret=True):
    """Opens a rendezvous as alice, joins it as bob, both through the library's own flow."""
    alice, bob = run.agent("alice"), run.agent("bob")
    info = alice.open_rendezvous(with_secret=with_secret)
    token, secret = info["token"], info.get("secret")
    check(token.startswith("rv-"), "issued token %r" % token)
    equal(info.get("role"), "initiator", "opener's role")
    equal(info.get("peer_id"), None, "nobody has joined yet")
    check(info.get("expires_at"), "expires_at")
    block = alice.handoff_block(info, objective="interop test")
    check(token in block and (secret is None or secret in block), "handoff block carries token and secret")

    # The initiator parks first; the responder joins a moment later.
    initiator = later(0.0, lambda: alice.await_peer(token, timeout=60, secret=secret))
    time.sleep(1.0)
    joined = bob.join_rendezvous(token, timeout=60, secret=secret)
    opened = initiator()
    return alice, bob, token, opened, joined


def scenario_pairing(run):
    """Rendezvous with the default pairing secret: directional tags in the header, pins."""
    alice, bob, token, opened, joined = pair(run)
    equal(opened["peer_id"], bob.id, "initiator sees the responder")
    equal(joined["peer_id"], alice.id, "responder sees the initiator")
    equal(opened["role"], "initiator", "initiator role")
    equal(joined["role"], "responder", "responder role")
    equal(opened["peer_fingerprint"], bob.my_fingerprint, "peer fingerprint (initiator)")
    equal(joined["peer_fingerprint"], alice.my_fingerprint, "peer fingerprint (responder)")
    equal((opened.get("verified"), joined.get("verified")), (True, True), "both sides verified")
    equal((opened.get("pinned"), joined.get("pinned")), (True, True), "both sides pinned")
    equal(alice.trust_store.get(bob.id), bob.my_fingerprint, "alice pinned bob")
    equal(bob.trust_store.get(alice.id), alice.my_fingerprint, "bob pinned alice")
    # The verification messages were consumed; nothing else is left behind.
    equal(alice.fetch().count, 0, "alice's inbox after verification")
    equal(bob.fetch().count, 0, "bob's inbox after verification")

    # A stranger cannot take the held responder role.
    mallory = run.agent("mallory")
    exc = raises(StringcupError, lambda: mallory.rendezvous(token=token, wait=0), "a third claimant")
    equal(exc.status, 409, "status for a held role")

    # The initiator speaks first; the pairing carries a conversation.
    alice.send(bob.id, "paired hello")
    got = bob.receive_one(timeout=10)
    equal((got.sender_id, got.text), (alice.id, "paired hello"), "first message after pairing")
    bob.send(alice.id, "paired reply")
    equal(alice.receive_one(timeout=10).text, "paired reply", "reply after pairing")

    # Releases are scoped to the caller; a second release is 404.
    equal(bob.rendezvous_release(token).get("status"), "released", "responder release")
    equal(alice.rendezvous_release(token).get("status"), "released", "initiator release")
    raises(NotFoundError, lambda: alice.rendezvous_release(token), "release of a gone rendezvous")

    # Self-join is detected by the client from the relay's role.
    info = alice.open_rendezvous()
    exc = raises(StringcupError, lambda: alice.join_rendezvous(info["token"], timeout=5), "self-join")
    check("pair with yourself" in str(exc), "self-join message: %s" % exc)

    # An invented token is refused (400), an unknown well-formed one is 404.
    raises(ValidationError, lambda: bob.rendezvous(token="rv-mine", wait=0), "invented token")
    raises(NotFoundError, lambda: bob.rendezvous(token="rv-" + "a" * 32, wait=0), "unknown token")


def scenario_pairing_unverified(run):
    """The same rendezvous without a secret (verified: False), and await_peer's timeout."""
    alice, bob, _, opened, joined = pair(run, with_secret=False)
    equal((opened["peer_id"], joined["peer_id"]), (bob.id, alice.id), "paired")
    equal((opened["verified"], joined["verified"]), (False, False), "unverified pairing")
    info = alice.open_rendezvous()
    raises(stringcup.PairingTimeout, lambda: alice.await_peer(info["token"], timeout=2), "nobody joins")


def scenario_topics(run):
    """Channels: create with members, notices, broadcast fan-out, verified labels, membership."""
    alice, bob, carol, dave = (run.agent(n) for n in ("alice", "bob", "carol", "dave"))
    unknown = "sc-" + "z" * 24

    created = alice.create_topic(label="ops room", members=[bob.id, carol.id, unknown])
    topic = created["id"]
    check(topic.startswith("tp-"), "assigned topic id %r" % topic)
    equal(created.get("unknown"), [unknown], "unknown ids reported by create")
    equal(created.get("member_count"), 3, "member_count after create")
    equal(alice.label_for(topic), "ops room", "the label stays client-side")

    # Each new member got an encrypted notice, labelled and verified against the roster.
    for member in (bob, carol):
        notice = member.receive_one(timeout=10)
        check(notice is not None, "%s got no membership notice" % member.id)
        equal(notice.sender_id, alice.id, "notice sender")
        equal(notice.channel, topic, "the notice's channel verified")
        check("ops room" in notice.text, "the notice carries the label: %r" % notice.text)

    roster = bob.topic(topic)
    equal([m["id"] for m in roster["members"]], [alice.id, bob.id, carol.id], "roster in join order")
    for member in roster["members"]:
        check(member.get("identity_public_key"), "roster keys")

    listed = {t["id"]: t for t in carol.topics()}
    check(topic in listed, "carol lists the topic")
    equal(listed[topic].get("owner_id"), alice.id, "owner_id in the list")
    equal(listed[topic].get("member_count"), 3, "member_count in the list")
    equal([t.get("is_owner") for t in alice.topics() if t["id"] == topic], [True], "is_owner for the owner")
    equal(listed[topic].get("is_owner"), False, "is_owner for a member")

    # The client refuses to create a second topic with exactly the same members.
    raises(ValidationError, lambda: alice.create_topic(members=[bob.id, carol.id]), "duplicate guard")

    # Broadcast: one roster read, one batch; each member decrypts its own copy.
    result = alice.broadcast(topic, "to everyone")
    equal(result["count"], 2, "broadcast delivered count")
    equal(result["recipients"], 2, "broadcast recipients")
    equal(result["failed"], [], "broadcast failures")
    for member in (bob, carol):
        got = member.receive_one(timeout=10)
        equal((got.sender_id, got.text, got.channel), (alice.id, "to everyone", topic), "broadcast copy")
    equal(alice.fetch().count, 0, "the sender is excluded by default")
    # Broadcasting by the local label resolves client-side to the id.
    equal(alice.broadcast("ops room", "by label")["count"], 2, "broadcast by label")
    for member in (bob, carol):
        equal(member.receive_one(timeout=10).text, "by label", "label broadcast copy")

    # A member who is not the owner cannot add; the owner can, with a notice.
    exc = raises(StringcupError, lambda: bob.add_members(topic, [dave.id]), "member adds")
    equal(exc.status, 403, "status for a non-owner add")
    added = alice.add_members(topic, [dave.id, bob.id])
    equal(added.get("added"), [dave.id], "added")
    equal(added.get("already_member"), [bob.id], "already_member")
    # The client notifies every id the relay did not report unknown (bob too).
    for member in (dave, bob):
        notice = member.receive_one(timeout=10)
        equal((notice.sender_id, notice.channel), (alice.id, topic), "add notice for %s" % member.id)

    # A channel label from someone outside the channel does not verify.
    outsider = run.agent("outsider")
    outsider.send(dave.id, stringcup.label_for_channel(topic, "forged broadcast"))
    forged = dave.receive_one(timeout=10)
    equal((forged.channel, forged.channel_claim), (None, topic), "an outsider's label is only a claim")

    # A non-member reading the roster gets 404 (not 403).
    raises(NotFoundError, lambda: outsider.topic(topic), "outsider roster read")

    # Members leave themselves; the owner removes others; the owner cannot be removed.
    equal(carol.remove_member(topic, carol.id).get("status"), "removed", "self removal")
    equal(alice.remove_member(topic, dave.id).get("status"), "removed", "owner removal")
    exc = raises(StringcupError, lambda: alice.remove_member(topic, alice.id), "owner removal of itself")
    equal(exc.status, 409, "status for removing the owner")
    equal([m["id"] for m in alice.topic(topic)["members"]], [alice.id, bob.id], "roster after removals")
    equal(alice.broadcast(topic, "smaller")["count"], 1, "broadcast after removals")
    equal(bob.receive_one(timeout=10).text, "smaller", "bob still receives")

    # Only the owner deletes.
    exc = raises(StringcupError, lambda: bob.delete_topic(topic), "member deletes")
    equal(exc.status, 403, "status for a non-owner delete")
    equal(alice.delete_topic(topic).get("status"), "deleted", "owner deletes")
    equal(alice.topics(), [], "no topics left")
    raises(NotFoundError, lambda: bob.topic(topic), "deleted topic")

    # A topic with no members at creation, and send_many partial success.
    empty = alice.create_topic()
    equal(empty.get("member_count"), 1, "a fresh topic holds only its owner")
    out = alice.send_many([bob.id, "sc-" + "y" * 24, carol.id], "fan-out")
    equal(out["count"], 2, "send_many stored count")
    equal([f["recipient_id"] for f in out["failed"]], ["sc-" + "y" * 24], "send_many failures")


def scenario_tokens(run):
    """Token info and rotation, identity updates and key rotation with the retired-key grace."""
    alice, bob = run.agent("alice"), run.agent("bob")
    info = alice.token_info()
    equal(info.get("identity_id"), alice.id, "token owner")
    for field in ("created_at", "last_used_at", "expires_at"):
        check(isinstance(info.get(field), str) and info[field], "token_info %s" % field)
    equal(info.get("inactivity_ttl_days"), 30, "inactivity_ttl_days")
    check(0 < info.get("expires_in_seconds", 0) <= 30 * 86400, "expires_in_seconds %r" % info)

    old = alice.identity.api_token
    path = run.identity_path("alice")
    new = alice.rotate_token(save_to=path)
    check(new and new != old, "a new token")
    equal(stringcup.Identity.load(path).api_token, new, "the new token was saved")
    equal(alice.token_info().get("identity_id"), alice.id, "the new token works")
    status, headers, body = run.raw("GET", "/tokens/current", token=old)
    equal(status, 401, "the old token is revoked")
    check("bearer" in (headers.get("WWW-Authenticate") or "").lower(), "bearer challenge")
    stale = Client(stringcup.Identity(alice.id, alice.identity.private_key_b64, old), base_url=run.base_url)
    raises(AuthError, stale.token_info, "a client holding the rotated-away token")

    # A reloaded client keeps working (identity file round trip).
    reloaded = Client.load_or_register(path, base_url=run.base_url, transcript=None)
    equal(reloaded.identity_source, "loaded", "identity loaded from disk")
    equal(reloaded.id, alice.id, "same identity after reload")
    bob.send(alice.id, "after token rotation")
    equal(reloaded.receive_one(timeout=10).text, "after token rotation", "reloaded client reads")

    # Display name updates.
    updated = alice.update_identity(display_name="alice 2")
    equal(updated.get("display_name"), "alice 2", "display_name updated")
    equal(updated.get("key_changed"), False, "key unchanged by a label edit")
    raises(ValidationError, lambda: alice._request("PUT", "/identities", {}), "empty update")

    # Key rotation: mail sealed to the old key (bob's cached view) still decrypts.
    bob.send(alice.id, "sealed to the old key")
    rotated = alice.rotate_identity_key(save_to=path)
    check(rotated.get("key_changed") is True, "key_changed on rotation")
    equal(rotated.get("identity_public_key"), alice.identity.public_key_b64, "relay serves the new key")
    equal(alice.receive_one(timeout=10).text, "sealed to the old key", "retired key decrypts")
    bob.trust_store.forget(alice.id)
    bob.peer_public_key(alice.id, refresh=True)
    bob.send(alice.id, "sealed to the new key")
    equal(alice.receive_one(timeout=10).text, "sealed to the new key", "new key decrypts")
    equal(bob.peer_info(alice.id)["fingerprint"], alice.my_fingerprint, "lookup serves the new key")


def scenario_limits(run):
    """The relay's refusals surface as the client's typed errors (relay started with small limits)."""
    alice, bob, carol, dave, erin = (run.agent(n) for n in ("alice", "bob", "carol", "dave", "erin"))
    _, _, info = run.raw("GET", "")
    max_bytes = info["message_max_bytes"]
    per_sender = info["inbox_max_pending_per_sender"]
    send_limit = info["rate_limits"]["send_per_hour"]
    check(per_sender + 3 <= send_limit, "limits chosen so the share fills before the budget: %r" % info)

    exc = raises(MessageTooLarge, lambda: alice.send(bob.id, "x" * (max_bytes + 1)), "an oversized message")
    equal(exc.status, 413, "status of an oversized message")
    # The largest plaintext that fits (the GCM tag adds 16 bytes).
    alice.send(bob.id, "y" * (max_bytes - 16))
    for i in range(per_sender - 1):
        alice.send(bob.id, "fill %d" % i)
    exc = raises(RecipientInboxFull, lambda: alice.send(bob.id, "one too many"), "per-sender share full")
    equal(exc.status, 507, "status of a full share")
    equal((exc.body or {}).get("error"), "sender_share_full", "507 code")
    check("your share" in (exc.body or {}).get("message", ""), "507 body: %r" % exc.body)
    # Another sender is unaffected; an ack frees room.
    carol.send(bob.id, "carol is fine")
    bob.ack(bob.fetch(limit=1).ids)
    alice.send(bob.id, "room again")

    # Rate-limit headers: the client tracks a budget per bucket, and reads X-RateLimit-Reset
    # as the Unix time the window frees up.
    alice.token_info()
    budget = alice._budgets.get("GET /tokens/current") or {}
    limit, remaining, reset = budget.get("limit"), budget.get("remaining"), budget.get("reset")
    check(limit and remaining is not None and reset, "budget headers were read: %r" % budget)
    now = int(time.time())
    check(now < reset <= now + 3600 + 5, "X-RateLimit-Reset %r is a Unix time within the hour (now %d)" % (reset, now))

    # The client paces itself when a bucket is nearly spent: it sleeps (at most 5 s) towards
    # X-RateLimit-Reset and says so on stderr. With a reset it cannot read as a time ahead of
    # it, it would never pause.
    import contextlib
    import io

    others = [alice, bob, carol, erin]
    dave.auto_throttle = False
    for i in range(send_limit - 1):
        dave.send(others[i % len(others)].id, "pacing %d" % i)
        equal(dave._budgets["POST /messages"]["remaining"], send_limit - 1 - i, "send budget tracked")
    dave.auto_throttle = True
    said = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stderr(said):
        dave.send(erin.id, "last of the budget")
    paused = time.monotonic() - started
    check("budget nearly spent" in said.getvalue(), "no throttle notice: %r" % said.getvalue())
    check(paused >= 4.0, "the client paused %.2fs before going on (expected about 5)" % paused)

    # Past the budget: 429 -> RateLimited with the relay's Retry-After.
    dave.auto_throttle = False
    exc = raises(RateLimited, lambda: dave.send(alice.id, "over budget"), "send budget exhausted")
    check(3000 < exc.retry_after <= 3600, "retry_after %r" % exc.retry_after)


class McpServer:
    """The published MCP server (`python3 -m stringcup_mcp`), spoken to over stdio JSON-RPC."""

    def __init__(self, run, name):
        import subprocess

        directory = os.path.join(run.work, "mcp-" + name)
        os.makedirs(directory, mode=0o700)
        env = dict(os.environ)
        env.update({
            "HOME": directory,
            "STRINGCUP_BASE_URL": run.base_url,
            "STRINGCUP_IDENTITY": os.path.join(directory, "identity.json"),
            "STRINGCUP_TRUST_STORE": os.path.join(directory, "trust_store.json"),
            "STRINGCUP_TRANSCRIPT": os.path.join(directory, "transcript.jsonl"),
            "PYTHONUNBUFFERED": "1",
        })
        env.pop("STRINGCUP_IDENTITY_NAME", None)
        self.name = name
        self.stderr = open(os.path.join(directory, "stderr"), "w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "stringcup_mcp"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
            env=env, cwd=directory, text=True, bufsize=1,
        )
        self.next_id = 0
        self.lock = threading.Lock()
        reply = self.rpc("initialize", {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "relay-lite-interop", "version": "1"},
        })
        check(reply.get("serverInfo", {}).get("name") == "stringcup", "MCP initialize: %r" % reply)
        self.notify("notifications/initialized")
        tools = {t["name"] for t in self.rpc("tools/list", {})["tools"]}
        for tool in ("whoami", "open_rendezvous", "await_peer", "join_rendezvous", "send", "receive",
                     "create_channel", "broadcast", "list_channels", "channel_info", "close_channel"):
            check(tool in tools, "MCP tool %s missing from %r" % (tool, sorted(tools)))

    def notify(self, method):
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}) + "\n")
        self.process.stdin.flush()

    def rpc(self, method, params):
        with self.lock:
            self.next_id += 1
            request_id = self.next_id
            self.process.stdin.write(json.dumps(
                {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        if not line:
            self.stderr.seek(0)
            raise Failure("MCP server %s closed its output; stderr:\n%s" % (self.name, self.stderr.read()))
        reply = json.loads(line)
        equal(reply.get("id"), request_id, "JSON-RPC id")
        if "error" in reply:
            raise Failure("MCP %s %s: %r" % (self.name, method, reply["error"]))
        return reply["result"]

    def call(self, tool, **arguments):
        result = self.rpc("tools/call", {"name": tool, "arguments": arguments})
        payload = result.get("structuredContent")
        if result.get("isError"):
            raise Failure("MCP %s %s failed: %r" % (self.name, tool, payload))
        return payload

    def close(self):
        try:
            self.process.stdin.close()
            self.process.wait(10)
        except Exception:  # noqa: BLE001
            self.process.kill()
        self.stderr.close()


def scenario_mcp(run):
    """Two published MCP servers, as two agents would run them: pair, talk, share a channel."""
    a, b = McpServer(run, "a"), McpServer(run, "b")
    try:
        me_a, me_b = a.call("whoami"), b.call("whoami")
        equal(me_a.get("identity_source"), "registered", "first whoami registers")
        check(me_a["id"] != me_b["id"], "two identities")

        opened = a.call("open_rendezvous", objective="interop")
        token, secret = opened["token"], opened["secret"]
        check(token.startswith("rv-") and secret.startswith("ps-"), "rendezvous handoff %r" % opened)
        check(token in opened["handoff"], "handoff block")
        initiator = later(0.0, lambda: a.call("await_peer", token=token, secret=secret, hold=60))
        time.sleep(1.0)
        joined = b.call("join_rendezvous", token=token, secret=secret, hold=60)
        paired = initiator()
        for side, result, peer in (("initiator", paired, me_b), ("responder", joined, me_a)):
            equal(result.get("paired"), True, "%s paired" % side)
            equal(result.get("verified"), True, "%s verified" % side)
            equal(result.get("pinned"), True, "%s pinned" % side)
            equal(result.get("role"), side, "%s role" % side)
            equal(result.get("peer_id"), peer["id"], "%s peer" % side)
            equal(result.get("peer_fingerprint"), peer["fingerprint"], "%s peer fingerprint" % side)

        sent = a.call("send", recipient_id=me_b["id"], text="hello from a")
        check(sent.get("sent") and sent.get("sent_seq"), "send: %r" % sent)
        got = b.call("receive", hold=20)
        equal((got.get("received"), got.get("from"), got.get("text")), (True, me_a["id"], "hello from a"), "receive")
        b.call("send", recipient_id=me_a["id"], text="hello from b")
        equal(a.call("receive", hold=20).get("text"), "hello from b", "reply")

        channel = a.call("create_channel", label="pair room", members=[me_b["id"]])
        equal((channel.get("members_added"), channel.get("unknown")), (1, []), "create_channel %r" % channel)
        notice = b.call("receive", hold=20)
        equal(notice.get("channel"), channel["channel_id"], "membership notice channel")
        listed = b.call("list_channels")
        equal([c["channel_id"] for c in listed["channels"]], [channel["channel_id"]], "list_channels")
        equal(listed["channels"][0]["owner"], me_a["id"], "channel owner")
        info = b.call("channel_info", channel_id=channel["channel_id"])
        equal(sorted(m["id"] for m in info["members"]), sorted([me_a["id"], me_b["id"]]), "channel_info")
        cast = a.call("broadcast", channel_id=channel["channel_id"], text="to the room")
        equal((cast.get("delivered"), cast.get("recipients")), (1, 1), "broadcast %r" % cast)
        got = b.call("receive", hold=20)
        equal((got.get("text"), got.get("channel")), ("to the room", channel["channel_id"]), "broadcast copy")
        equal(a.call("close_channel", channel_id=channel["channel_id"]).get("closed"), True, "close_channel")
        equal(b.call("list_channels").get("count"), 0, "closed channel gone")
    finally:
        a.close()
        b.close()


SCENARIOS = {
    "info": scenario_info,
    "messaging": scenario_messaging,
    "idempotency": scenario_idempotency,
    "pairing": scenario_pairing,
    "pairing-unverified": scenario_pairing_unverified,
    "topics": scenario_topics,
    "tokens": scenario_tokens,
    "limits": scenario_limits,
    "mcp": scenario_mcp,
}


def main(argv):
    if len(argv) != 3 or argv[2] not in SCENARIOS:
        sys.stderr.write("usage: %s <base_url> {%s}\n" % (argv[0], "|".join(SCENARIOS)))
        return 2
    base_url, name = argv[1], argv[2]
    with tempfile.TemporaryDirectory(prefix="stringcup-interop-") as work:
        try:
            SCENARIOS[name](Run(base_url, work))
        except Failure as exc:
            traceback.print_exc()
            sys.stderr.write("FAIL %s: %s\n" % (name, exc))
            return 1
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            sys.stderr.write("FAIL %s: unexpected %s: %s\n" % (name, type(exc).__name__, exc))
            return 1
    print("ok %s" % name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
