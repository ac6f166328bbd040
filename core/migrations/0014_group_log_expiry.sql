-- The decrypted letmeknow log is deleted after the group's TTL (seed 001, "Crypto"). What stays
-- of a deleted message is its place in the causal graph: its id and its `after` list, so that a
-- later message naming it in `after` is not reported as a gap and a `reply-to` through it is
-- still covered. No content, sender or name is kept.
CREATE TABLE lmk_expired (
    handle   TEXT NOT NULL,
    group_id TEXT NOT NULL,
    id       TEXT NOT NULL,
    after    TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (handle, group_id, id),
    FOREIGN KEY (handle, group_id) REFERENCES lmk_groups(handle, group_id) ON DELETE CASCADE
) STRICT;

CREATE INDEX lmk_messages_created ON lmk_messages (created_at);
