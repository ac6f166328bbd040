-- Stringcup v2 (`/api/v2`): identities, their inboxes, idempotency keys, topics, rendezvous.
-- Every id and token is issued by the relay; tokens are stored only as SHA-256.

-- One row per identity. The bearer token lives here (one token per identity; rotation replaces
-- it). `next_inbox_id` and `next_sent_seq` are the identity's two numbering spaces (B.3.5),
-- kept here so a number is never reused after the messages holding the highest ones are acked.
CREATE TABLE sc_identity (
    id                 TEXT    NOT NULL PRIMARY KEY,     -- `sc-` + 24 base32 characters
    public_key         BLOB    NOT NULL,                 -- raw X25519 key, 32 bytes
    algo               TEXT    NOT NULL DEFAULT 'x25519',
    display_name       TEXT    NOT NULL DEFAULT '',      -- '' means none
    token_hash         BLOB    NOT NULL UNIQUE,          -- SHA-256 of the bearer token
    token_created_ms   INTEGER NOT NULL,
    token_last_used_ms INTEGER NOT NULL,                 -- coarse: refreshed at most once a minute
    key_updated_ms     INTEGER NOT NULL,                 -- moves only when the key changes
    updated_ms         INTEGER NOT NULL,                 -- moves on any change
    created_ms         INTEGER NOT NULL,
    next_inbox_id      INTEGER NOT NULL DEFAULT 1,
    next_sent_seq      INTEGER NOT NULL DEFAULT 1
) STRICT;

CREATE INDEX sc_identity_token_last_used ON sc_identity (token_last_used_ms);

-- A message waits until its recipient acknowledges it; nothing deletes it by age. `sender` is
-- deliberately not a foreign key: mail from an identity that is later reclaimed stays
-- deliverable.
CREATE TABLE sc_message (
    recipient      TEXT    NOT NULL REFERENCES sc_identity (id) ON DELETE CASCADE,
    id             INTEGER NOT NULL,                     -- the recipient's number
    sender         TEXT    NOT NULL,
    sent_seq       INTEGER NOT NULL,                     -- the sender's number
    header_version INTEGER NOT NULL DEFAULT 2,
    header_algo    TEXT    NOT NULL DEFAULT 'x25519+ecies+aes256gcm',
    ephemeral_pub  BLOB    NOT NULL,
    iv             BLOB    NOT NULL,
    ciphertext     BLOB    NOT NULL,
    size           INTEGER NOT NULL,                     -- ciphertext bytes, for the pending limits
    created_ms     INTEGER NOT NULL,
    PRIMARY KEY (recipient, id)
) STRICT;

-- Covers the per-sender and whole-inbox pending counts and byte sums.
CREATE INDEX sc_message_share ON sc_message (recipient, sender, size);

-- `Idempotency-Key`s, scoped to the sender. The primary key is the unique constraint a send
-- reserves its key against before the message is stored.
CREATE TABLE sc_idempotency (
    sender     TEXT    NOT NULL REFERENCES sc_identity (id) ON DELETE CASCADE,
    key        TEXT    NOT NULL,
    recipient  TEXT    NOT NULL,
    sent_seq   INTEGER NOT NULL DEFAULT 0,               -- 0 only inside the reserving write
    created_ms INTEGER NOT NULL,
    PRIMARY KEY (sender, key)
) STRICT;

CREATE INDEX sc_idempotency_created ON sc_idempotency (created_ms);

-- Topics: membership directories with relay-issued ids. `legacy_name` is '' for every topic
-- relay-lite creates; it exists so a topic imported from a deployment that once let clients
-- name topics resolves by either form through the same checks.
CREATE TABLE sc_topic (
    id          TEXT    NOT NULL PRIMARY KEY,            -- `tp-` + 24 base32 characters
    owner       TEXT    NOT NULL REFERENCES sc_identity (id) ON DELETE CASCADE,
    legacy_name TEXT    NOT NULL DEFAULT '',
    created_ms  INTEGER NOT NULL
) STRICT;

CREATE UNIQUE INDEX sc_topic_legacy_name ON sc_topic (legacy_name) WHERE legacy_name <> '';

CREATE TABLE sc_topic_member (
    topic    TEXT    NOT NULL REFERENCES sc_topic (id) ON DELETE CASCADE,
    member   TEXT    NOT NULL REFERENCES sc_identity (id) ON DELETE CASCADE,
    added_ms INTEGER NOT NULL,
    PRIMARY KEY (topic, member)
) STRICT;

CREATE INDEX sc_topic_member_member ON sc_topic_member (member);

-- Rendezvous, by the SHA-256 of the issued token. `version` grows on every claim or release
-- so parked requests can be woken.
CREATE TABLE sc_rendezvous (
    token_hash BLOB    NOT NULL PRIMARY KEY,
    created_ms INTEGER NOT NULL,
    expires_ms INTEGER NOT NULL,
    version    INTEGER NOT NULL DEFAULT 1
) STRICT;

CREATE INDEX sc_rendezvous_expires ON sc_rendezvous (expires_ms);

CREATE TABLE sc_rendezvous_claim (
    token_hash BLOB    NOT NULL REFERENCES sc_rendezvous (token_hash) ON DELETE CASCADE,
    role       TEXT    NOT NULL CHECK (role IN ('initiator', 'responder')),
    identity   TEXT    NOT NULL REFERENCES sc_identity (id) ON DELETE CASCADE,
    claimed_ms INTEGER NOT NULL,
    PRIMARY KEY (token_hash, role)
) STRICT;

CREATE INDEX sc_rendezvous_claim_identity ON sc_rendezvous_claim (identity);

-- Lifetime counters for the public statistics (one row).
CREATE TABLE sc_counter (
    name  TEXT    NOT NULL PRIMARY KEY,
    value INTEGER NOT NULL DEFAULT 0
) STRICT;

INSERT INTO sc_counter (name, value) VALUES ('messages_stored', 0);
