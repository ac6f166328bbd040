-- letagents v1 mailboxes and their waiting envelopes.

-- One row per mailbox, created by its owner's first login and erased after 14 idle days with
-- nothing waiting. `next_seq` is kept here (not derived from the envelopes) so a seq is never
-- reused after the envelopes holding the highest seqs are acked.
CREATE TABLE la_mailbox (
    id             TEXT    NOT NULL PRIMARY KEY,  -- b64u(sig public key)
    drop_hash      TEXT    NOT NULL,              -- b64u(SHA-256(drop)), set by the last login
    last_login_ms  INTEGER NOT NULL DEFAULT 0,    -- `ts` of the last accepted login (replay guard)
    last_active_ms INTEGER NOT NULL DEFAULT 0,    -- relay clock at the owner's last login or ack
    next_seq       INTEGER NOT NULL DEFAULT 1,
    created_ms     INTEGER NOT NULL DEFAULT 0
) STRICT;

CREATE TABLE la_envelope (
    mailbox     TEXT    NOT NULL REFERENCES la_mailbox (id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    received_ms INTEGER NOT NULL,                 -- relay clock at commit, for retention
    body        BLOB    NOT NULL,                 -- the opaque envelope, as received
    PRIMARY KEY (mailbox, seq)
) STRICT;

CREATE INDEX la_envelope_received ON la_envelope (received_ms);

CREATE INDEX la_mailbox_active ON la_mailbox (last_active_ms);
