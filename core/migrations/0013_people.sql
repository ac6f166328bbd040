-- Switchboard profile database: one contact per person across protocols (issue 20).
-- Same house rules as 0001.

-- A person: one name and one safety number over several contact rows (channels), made by adding
-- their Switchboard contact link. A contact added by a bare protocol address has no person and
-- works as before; its rules, allow list and messages stay on its own row.
CREATE TABLE people (
    id            INTEGER PRIMARY KEY,
    name          TEXT NOT NULL UNIQUE,
    identity_key  BLOB NOT NULL UNIQUE,         -- the Ed25519 key that signed their link
    safety_number TEXT NOT NULL,
    link          TEXT NOT NULL,                -- the link as pasted (newest)
    created_at    INTEGER NOT NULL
) STRICT;

-- The person a contact row is a channel of; NULL for a contact of its own.
ALTER TABLE contacts ADD COLUMN person_id INTEGER REFERENCES people(id) ON DELETE SET NULL;
CREATE INDEX contacts_by_person ON contacts (person_id);

-- An outgoing message that another channel carried after its own failed: the id it was first
-- queued under ('' otherwise), so `show` tells the path it took.
ALTER TABLE messages ADD COLUMN fallback_of TEXT NOT NULL DEFAULT '';
