-- Switchboard profile database, version 15: Agent Mail attachments (§5.1 non-text parts).
-- Same house rules as 0001.

-- Every non-text part of an Agent Mail message we accepted or sent, by its index in the
-- message's parts. `name` is the sender's inert display name ('' when it gave none): never a
-- path. The bytes are handed out only on request (save, download, an agent's read), never
-- opened. They go with their message (ON DELETE CASCADE); the engine bounds their total size.
CREATE TABLE am_attachments (
    message_rowid INTEGER NOT NULL REFERENCES messages(rowid_) ON DELETE CASCADE,
    part          INTEGER NOT NULL,
    name          TEXT NOT NULL DEFAULT '',
    media_type    TEXT NOT NULL,
    size          INTEGER NOT NULL,
    data          BLOB NOT NULL,
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (message_rowid, part)
) STRICT;
