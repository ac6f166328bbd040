-- Switchboard profile database: letmeknow groups as the person's conversations. Same house rules
-- as 0001.

-- The person's own name for each group: set when they create or join it (from the inviter's name
-- for it), renamable, never sent to the members. The UI shows it instead of the group id.
CREATE TABLE lmk_group_names (
    group_id   TEXT PRIMARY KEY,
    name       TEXT NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;
