-- Switchboard profile database: the delivery policy for letmeknow groups. Same house rules as 0001.

-- Per (session, group) policy state, the group counterpart of `conversations`: the loop guard
-- counts group messages after `reset_rowid` (an `lmk_messages` rowid: the last operator input in
-- the group); `outbound` overrides the profile-wide review policy for the session's agent sends.
CREATE TABLE lmk_policy (
    handle      TEXT NOT NULL,
    group_id    TEXT NOT NULL,
    reset_rowid INTEGER NOT NULL DEFAULT 0,
    outbound    TEXT NOT NULL DEFAULT 'default' CHECK (outbound IN ('default', 'auto', 'review')),
    PRIMARY KEY (handle, group_id),
    FOREIGN KEY (handle, group_id) REFERENCES lmk_groups(handle, group_id) ON DELETE CASCADE
) STRICT;

-- 0004's `lmk_groups.review` was never read: the outbound mode lives in `lmk_policy` beside the
-- loop guard's reset, with `default` meaning the profile-wide policy, as for contacts.
ALTER TABLE lmk_groups DROP COLUMN review;

-- The review queue also holds agent sends to a group: exactly one of `contact_id` (a 1:1 send)
-- and `group_id` (a group send by session `agent`, optionally addressed to member `to_fp`).
-- SQLite cannot relax NOT NULL in place, so the table is rebuilt with its rows.
CREATE TABLE review_queue_new (
    id         INTEGER PRIMARY KEY,
    agent      TEXT NOT NULL,
    contact_id INTEGER REFERENCES contacts(id) ON DELETE CASCADE,
    group_id   TEXT,
    to_fp      TEXT,
    kind       TEXT NOT NULL,
    body       TEXT NOT NULL,
    reply_to   TEXT,
    to_agent   TEXT,
    state      TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'approved', 'rejected')),
    message_id TEXT,
    created_at INTEGER NOT NULL,
    decided_at INTEGER NOT NULL DEFAULT 0,
    CHECK ((contact_id IS NULL) <> (group_id IS NULL))
) STRICT;
INSERT INTO review_queue_new (id, agent, contact_id, kind, body, reply_to, to_agent, state, message_id, created_at,
    decided_at)
SELECT id, agent, contact_id, kind, body, reply_to, to_agent, state, message_id, created_at, decided_at
FROM review_queue;
DROP TABLE review_queue;
ALTER TABLE review_queue_new RENAME TO review_queue;
CREATE INDEX review_queue_pending ON review_queue (state, id);
