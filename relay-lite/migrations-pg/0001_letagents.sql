-- letagents v1 mailboxes and their waiting envelopes (PostgreSQL; the SQLite schema is
-- migrations/0001_letagents.sql, same columns and meaning).

-- `next_seq` is the mailbox's own counter: a deposit locks the mailbox row (`FOR UPDATE`), so
-- instances committing to one mailbox take turns and a seq is never reused or skipped by a
-- reader's cursor.
CREATE TABLE la_mailbox (
    id             TEXT   NOT NULL PRIMARY KEY,
    drop_hash      TEXT   NOT NULL,
    last_login_ms  BIGINT NOT NULL DEFAULT 0,
    last_active_ms BIGINT NOT NULL DEFAULT 0,
    next_seq       BIGINT NOT NULL DEFAULT 1,
    created_ms     BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE la_envelope (
    mailbox     TEXT   NOT NULL REFERENCES la_mailbox (id) ON DELETE CASCADE,
    seq         BIGINT NOT NULL,
    received_ms BIGINT NOT NULL,
    body        BYTEA  NOT NULL,
    PRIMARY KEY (mailbox, seq)
);

CREATE INDEX la_envelope_received ON la_envelope (received_ms);

CREATE INDEX la_mailbox_active ON la_mailbox (last_active_ms);
