-- Agent Mail 1.0 relay state (§4.2, §7.1, §8).

-- The current card of each mailbox; the row also binds the mailbox to its first card's owner.
CREATE TABLE am_mailboxes (
    mailbox_id    TEXT PRIMARY KEY,
    owner         TEXT NOT NULL,
    card          BLOB NOT NULL,       -- JCS of the current card envelope
    accepted_at   INTEGER NOT NULL,
    receive_until INTEGER NOT NULL,
    next_seq      INTEGER NOT NULL DEFAULT 1
);

-- The service-wide live-write nonce cache, per actor.
CREATE TABLE am_nonces (
    actor       TEXT PRIMARY KEY,
    max_nonce   INTEGER NOT NULL,
    valid_until INTEGER NOT NULL
);

-- Accepted packets. `body` is NULL once the owner deletes the packet: the row stays as the
-- acceptance tombstone (replay protection) until the packet expires.
CREATE TABLE am_packets (
    packet_id   TEXT PRIMARY KEY,
    mailbox_id  TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    accepted_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    size        INTEGER NOT NULL,
    body        BLOB
);
CREATE UNIQUE INDEX am_packets_by_seq ON am_packets (mailbox_id, seq);

-- Owner-managed sender blocking (§7.4): new packets from these senders are refused with
-- `permission_denied`; accepted packets and exact-retry lookups are unaffected.
CREATE TABLE am_blocked (
    mailbox_id TEXT NOT NULL,
    sender     TEXT NOT NULL,
    PRIMARY KEY (mailbox_id, sender)
);
