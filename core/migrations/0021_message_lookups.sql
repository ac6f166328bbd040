-- Switchboard profile database, version 21: looking up one-to-one messages by contact and by id
-- stops reading the whole message table. Same house rules as 0001.
--
-- `messages` had only `UNIQUE (direction, protocol, peer, id)` and `(direction, shown)`, so a
-- question by contact or by bare id read every message (or every outgoing one). With 100,000
-- messages, measured on a copy of the schema: whether an agent sent the message a reply answers
-- (every reply an agent's queue classifies) ~28 ms, a conversation's hops for the loop guard
-- (every message it classifies) ~17 ms, whether a person's channel last failed (every send to a
-- person) ~26 ms, a message by id (`show`, replies, fallbacks) ~21 ms, a conversation page
-- ~14 ms, a person's conversation ~40 ms. Each is an index range below.

-- By contact (SQLite keeps the rowid in the index: "newest first" and "since row N" are ranges).
CREATE INDEX messages_by_contact ON messages (contact_id);

-- By id alone (the unique index wants direction, protocol and peer first).
CREATE INDEX messages_by_id ON messages (id);

-- Messages another channel carried: only those rows.
CREATE INDEX messages_fallbacks ON messages (fallback_of) WHERE fallback_of != '';
