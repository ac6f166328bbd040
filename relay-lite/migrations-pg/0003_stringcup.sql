-- Stringcup v2 (PostgreSQL; the SQLite schema is migrations/0002_stringcup.sql and
-- 0003_stringcup_header_extra.sql, same columns and meaning).

-- `next_inbox_id` and `next_sent_seq` are the identity's own counters (B.3.5): a send locks the
-- recipient's row (`FOR UPDATE`) before it checks the pending limits and takes a number, so
-- instances storing into one inbox take turns, a number is never reused and a reader's cursor
-- never skips a late commit.
CREATE TABLE sc_identity (
    id                 TEXT   NOT NULL PRIMARY KEY,
    public_key         BYTEA  NOT NULL,
    algo               TEXT   NOT NULL DEFAULT 'x25519',
    display_name       TEXT   NOT NULL DEFAULT '',
    token_hash         BYTEA  NOT NULL UNIQUE,
    token_created_ms   BIGINT NOT NULL,
    token_last_used_ms BIGINT NOT NULL,
    key_updated_ms     BIGINT NOT NULL,
    updated_ms         BIGINT NOT NULL,
    created_ms         BIGINT NOT NULL,
    next_inbox_id      BIGINT NOT NULL DEFAULT 1,
    next_sent_seq      BIGINT NOT NULL DEFAULT 1
);

CREATE INDEX sc_identity_token_last_used ON sc_identity (token_last_used_ms);

-- `sender` is deliberately not a foreign key: mail from a reclaimed identity stays deliverable.
CREATE TABLE sc_message (
    recipient      TEXT   NOT NULL REFERENCES sc_identity (id) ON DELETE CASCADE,
    id             BIGINT NOT NULL,
    sender         TEXT   NOT NULL,
    sent_seq       BIGINT NOT NULL,
    header_version BIGINT NOT NULL DEFAULT 2,
    header_algo    TEXT   NOT NULL DEFAULT 'x25519+ecies+aes256gcm',
    ephemeral_pub  BYTEA  NOT NULL,
    iv             BYTEA  NOT NULL,
    ciphertext     BYTEA  NOT NULL,
    size           BIGINT NOT NULL,
    created_ms     BIGINT NOT NULL,
    header_extra   TEXT   NOT NULL DEFAULT '',
    PRIMARY KEY (recipient, id)
);

CREATE INDEX sc_message_share ON sc_message (recipient, sender, size);

-- `Idempotency-Key`s, scoped to the sender. The primary key is the reservation: of two
-- instances inserting one key at once, the second waits for the first's commit and then finds
-- its row (one row, identical answers).
CREATE TABLE sc_idempotency (
    sender     TEXT   NOT NULL REFERENCES sc_identity (id) ON DELETE CASCADE,
    key        TEXT   NOT NULL,
    recipient  TEXT   NOT NULL,
    sent_seq   BIGINT NOT NULL DEFAULT 0,
    created_ms BIGINT NOT NULL,
    PRIMARY KEY (sender, key)
);

CREATE INDEX sc_idempotency_created ON sc_idempotency (created_ms);

-- `ord` orders listings the way SQLite's rowid does (creation order); it is never a cursor.
CREATE TABLE sc_topic (
    id          TEXT   NOT NULL PRIMARY KEY,
    owner       TEXT   NOT NULL REFERENCES sc_identity (id) ON DELETE CASCADE,
    legacy_name TEXT   NOT NULL DEFAULT '',
    created_ms  BIGINT NOT NULL,
    ord         BIGINT GENERATED ALWAYS AS IDENTITY
);

CREATE UNIQUE INDEX sc_topic_legacy_name ON sc_topic (legacy_name) WHERE legacy_name <> '';

CREATE TABLE sc_topic_member (
    topic    TEXT   NOT NULL REFERENCES sc_topic (id) ON DELETE CASCADE,
    member   TEXT   NOT NULL REFERENCES sc_identity (id) ON DELETE CASCADE,
    added_ms BIGINT NOT NULL,
    ord      BIGINT GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (topic, member)
);

CREATE INDEX sc_topic_member_member ON sc_topic_member (member);

CREATE TABLE sc_rendezvous (
    token_hash BYTEA  NOT NULL PRIMARY KEY,
    created_ms BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL,
    version    BIGINT NOT NULL DEFAULT 1
);

CREATE INDEX sc_rendezvous_expires ON sc_rendezvous (expires_ms);

CREATE TABLE sc_rendezvous_claim (
    token_hash BYTEA  NOT NULL REFERENCES sc_rendezvous (token_hash) ON DELETE CASCADE,
    role       TEXT   NOT NULL CHECK (role IN ('initiator', 'responder')),
    identity   TEXT   NOT NULL REFERENCES sc_identity (id) ON DELETE CASCADE,
    claimed_ms BIGINT NOT NULL,
    PRIMARY KEY (token_hash, role)
);

CREATE INDEX sc_rendezvous_claim_identity ON sc_rendezvous_claim (identity);

-- Lifetime counters for the public statistics, in shards: each writer adds to its own shard
-- (drawn when it starts), so instances never queue behind one hot row; readers sum them.
CREATE TABLE sc_counter (
    name  TEXT   NOT NULL,
    shard BIGINT NOT NULL,
    value BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (name, shard)
);
