-- letmeknow group logs and invites (PostgreSQL; the SQLite schema is migrations/0005_letmeknow.sql).

-- The epoch compare-and-set locks the group row (`FOR UPDATE`), so two instances posting a
-- commit at one epoch take turns: the second sees the advanced epoch and gets 409.
CREATE TABLE lmk_groups (
    group_id    TEXT   NOT NULL PRIMARY KEY,
    epoch       BIGINT NOT NULL DEFAULT 0,
    next_seq    BIGINT NOT NULL DEFAULT 1,
    last_active BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE lmk_messages (
    group_id    TEXT   NOT NULL,
    seq         BIGINT NOT NULL,
    received_at BIGINT NOT NULL,
    data        BYTEA  NOT NULL,
    PRIMARY KEY (group_id, seq)
);
CREATE INDEX lmk_messages_by_time ON lmk_messages (received_at);

CREATE TABLE lmk_invites (
    invite_id    TEXT   NOT NULL PRIMARY KEY,
    owner_hash   TEXT   NOT NULL,
    expires_at   BIGINT NOT NULL,
    join_data    BYTEA,
    welcome_data BYTEA
);
CREATE INDEX lmk_invites_by_expiry ON lmk_invites (expires_at);
