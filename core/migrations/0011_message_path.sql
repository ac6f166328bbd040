-- Switchboard profile database: which path carried a message (issue 17, LAN direct delivery).
-- Same house rules as 0001.

-- `direct`: handed to (or received from) a nearby contact over the LAN layer; `relay`: through
-- a relay; '' for rows from before this column and for outgoing messages not yet handed over.
ALTER TABLE messages ADD COLUMN path TEXT NOT NULL DEFAULT '' CHECK (path IN ('', 'direct', 'relay'));

-- The same for the audit log's rows about one transfer (queued, refused and the like stay '').
ALTER TABLE audit ADD COLUMN path TEXT NOT NULL DEFAULT '' CHECK (path IN ('', 'direct', 'relay'));
