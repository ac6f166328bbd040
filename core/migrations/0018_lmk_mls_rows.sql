-- Switchboard profile database, version 18: a group session's OpenMLS state as one row per
-- storage entry (issue 16: store only what changed). Same house rules as 0001.

-- One row per OpenMLS storage entry of a session (`key` as the storage provider lays it out:
-- label, JSON key, version; `value` its JSON). Each MLS operation upserts the entries it wrote and
-- deletes the ones it removed, in the same transaction as the message rows it produced; a load
-- reads them all back. Rowid table, not WITHOUT ROWID: a ratchet tree's value runs to tens of
-- kilobytes in a large group.
CREATE TABLE lmk_mls_rows (
    handle TEXT NOT NULL REFERENCES lmk_sessions(handle) ON DELETE CASCADE,
    key    BLOB NOT NULL,
    value  BLOB NOT NULL,
    PRIMARY KEY (handle, key)
) STRICT;

-- `lmk_sessions.mls_state` (0004) stays what it was, the legacy snapshot of the whole state, and
-- is no longer written: a session whose snapshot is not empty is moved into `lmk_mls_rows` on its
-- first load after this migration (rows written and the snapshot emptied in one transaction); a
-- session made after it starts with an empty snapshot.
