-- Switchboard profile database: letmeknow group deliveries are handed out under a lease, as agent
-- deliveries are since 0006. Same house rules as 0001.

-- `deliveries` (`group_read` without id, `listen --handle`) hands a session's due rows out under a
-- random `lease` id taken at `leased_at`: such a row is *handed* (`lease` set, `read` still 0).
-- The adapter's `ack` of that lease makes them `read` = 1, and only then do they count for the read
-- frontier (the `after` of the session's next send). A lease not acked within the lease timeout is
-- handed out again under a new lease (`handed_count` > 1 marks the items as redelivered).
ALTER TABLE lmk_messages ADD COLUMN lease TEXT NOT NULL DEFAULT '';
ALTER TABLE lmk_messages ADD COLUMN leased_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE lmk_messages ADD COLUMN handed_count INTEGER NOT NULL DEFAULT 0;
CREATE INDEX lmk_messages_lease ON lmk_messages (lease) WHERE lease != '';
