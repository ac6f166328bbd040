-- Agent Mail 1.0 relay state (PostgreSQL; the SQLite schema is migrations/0004_agent_mail.sql
-- and 0006_agent_mail_counters.sql, same columns and meaning).

-- A delivery locks its mailbox row (`FOR UPDATE`) before it reads the packet's history, checks
-- the quota and takes `next_seq`, so instances delivering to one mailbox (or the same packet
-- twice) take turns. `stored_packets` / `stored_bytes` count undeleted packets, expired but
-- unswept ones included (an upper bound of the quota's figures).
CREATE TABLE am_mailboxes (
    mailbox_id     TEXT   NOT NULL PRIMARY KEY,
    owner          TEXT   NOT NULL,
    card           BYTEA  NOT NULL,
    accepted_at    BIGINT NOT NULL,
    receive_until  BIGINT NOT NULL,
    next_seq       BIGINT NOT NULL DEFAULT 1,
    stored_packets BIGINT NOT NULL DEFAULT 0,
    stored_bytes   BIGINT NOT NULL DEFAULT 0
);

CREATE INDEX am_mailboxes_receive_until ON am_mailboxes (receive_until);

-- The service-wide live-write nonce cache, per actor.
CREATE TABLE am_nonces (
    actor       TEXT   NOT NULL PRIMARY KEY,
    max_nonce   BIGINT NOT NULL,
    valid_until BIGINT NOT NULL
);

-- Accepted packets; `body` is NULL once the owner deletes the packet: the row stays as the
-- acceptance tombstone (replay protection) until the packet expires.
CREATE TABLE am_packets (
    packet_id   TEXT   NOT NULL PRIMARY KEY,
    mailbox_id  TEXT   NOT NULL,
    seq         BIGINT NOT NULL,
    accepted_at BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    size        BIGINT NOT NULL,
    body        BYTEA
);

CREATE UNIQUE INDEX am_packets_by_seq ON am_packets (mailbox_id, seq);
CREATE INDEX am_packets_expires ON am_packets (expires_at);

CREATE TABLE am_blocked (
    mailbox_id TEXT NOT NULL,
    sender     TEXT NOT NULL,
    PRIMARY KEY (mailbox_id, sender)
);
