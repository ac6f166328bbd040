-- letmeknow group logs and invites (specs/letmeknow-relay.md).

-- One row per group ever written: the current MLS epoch (the compare-and-set target) and the
-- next log position. The row outlives the deletion of old messages, so the epoch survives.
CREATE TABLE lmk_groups (
    group_id    TEXT PRIMARY KEY,
    epoch       INTEGER NOT NULL DEFAULT 0,
    next_seq    INTEGER NOT NULL DEFAULT 1,
    last_active INTEGER NOT NULL DEFAULT 0
) STRICT;

-- The ciphertext log, kept for the retention period.
CREATE TABLE lmk_messages (
    group_id    TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    received_at INTEGER NOT NULL,
    data        BLOB NOT NULL,
    PRIMARY KEY (group_id, seq)
) STRICT;
CREATE INDEX lmk_messages_by_time ON lmk_messages (received_at);

-- Pending invites: one join and one welcome each, deleted at expiry. Only the SHA-256 of the
-- owner token is kept.
CREATE TABLE lmk_invites (
    invite_id    TEXT PRIMARY KEY,
    owner_hash   TEXT NOT NULL,
    expires_at   INTEGER NOT NULL,
    join_data    BLOB,
    welcome_data BLOB
) STRICT;
CREATE INDEX lmk_invites_by_expiry ON lmk_invites (expires_at);
