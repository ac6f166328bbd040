-- Switchboard profile database: letmeknow (MLS groups). Same house rules as 0001.

-- One row per agent session that is (or was) a group member: its random two-word handle, the
-- display name in its credential, its signature public key, and its whole OpenMLS state,
-- rewritten in the same transaction as the rows each MLS operation produced.
CREATE TABLE lmk_sessions (
    handle        TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    signature_key BLOB NOT NULL,
    mls_state     BLOB NOT NULL,
    created_at    INTEGER NOT NULL
) STRICT;

-- The groups a session is in: which relay carries the log, how far the session has read it,
-- and what became of the membership.
CREATE TABLE lmk_groups (
    handle    TEXT NOT NULL REFERENCES lmk_sessions(handle) ON DELETE CASCADE,
    group_id  TEXT NOT NULL,
    relay     TEXT NOT NULL,
    cursor    INTEGER NOT NULL DEFAULT 0,
    state     TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'removed', 'left', 'expired')),
    review    TEXT NOT NULL DEFAULT 'auto' CHECK (review IN ('auto', 'review')),
    joined_at INTEGER NOT NULL,
    PRIMARY KEY (handle, group_id)
) STRICT;

-- The decrypted local log: application messages (`message`, `leave`), membership events
-- (`event`) and problems the session detected (`alert`: gaps, epoch-auth mismatches, messages
-- that do not decrypt). `read` = entered the agent's context (the read frontier).
CREATE TABLE lmk_messages (
    rowid_      INTEGER PRIMARY KEY,
    handle      TEXT NOT NULL,
    group_id    TEXT NOT NULL,
    id          TEXT NOT NULL,
    seq         INTEGER NOT NULL DEFAULT 0,
    epoch       INTEGER NOT NULL DEFAULT 0,
    kind        TEXT NOT NULL CHECK (kind IN ('message', 'leave', 'event', 'alert')),
    state       TEXT NOT NULL DEFAULT 'done' CHECK (state IN ('done', 'sending', 'commit_pending')),
    outgoing    INTEGER NOT NULL DEFAULT 0,
    sender_fp   TEXT NOT NULL DEFAULT '',
    sender_name TEXT NOT NULL DEFAULT '',
    to_fp       TEXT NOT NULL DEFAULT '',
    reply_to    TEXT NOT NULL DEFAULT '',
    after       TEXT NOT NULL DEFAULT '[]',
    content     TEXT NOT NULL DEFAULT '',
    read        INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    UNIQUE (handle, group_id, id),
    FOREIGN KEY (handle, group_id) REFERENCES lmk_groups(handle, group_id) ON DELETE CASCADE
) STRICT;
CREATE INDEX lmk_messages_unread ON lmk_messages (handle, read);

-- Who each member is to this session: display name, fingerprint, who added them.
CREATE TABLE lmk_member_notes (
    handle      TEXT NOT NULL,
    group_id    TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    name        TEXT NOT NULL,
    invited_by  TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (handle, group_id, fingerprint),
    FOREIGN KEY (handle, group_id) REFERENCES lmk_groups(handle, group_id) ON DELETE CASCADE
) STRICT;

-- The epoch authenticator of every epoch this session was in, to check `epoch-auth`.
CREATE TABLE lmk_epoch_auth (
    handle   TEXT NOT NULL,
    group_id TEXT NOT NULL,
    epoch    INTEGER NOT NULL,
    auth     BLOB NOT NULL,
    PRIMARY KEY (handle, group_id, epoch),
    FOREIGN KEY (handle, group_id) REFERENCES lmk_groups(handle, group_id) ON DELETE CASCADE
) STRICT;
