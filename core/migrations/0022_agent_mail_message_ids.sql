-- Switchboard profile database, version 22: Agent Mail messages found by id without reading them
-- all. Same house rules as 0001.
--
-- `am_messages` is keyed by (recipient, sender, message_id); the lookups a sent message's retry
-- and a received message's thread make name the message id without the recipient, so SQLite
-- read every Agent Mail message for each.
CREATE INDEX am_messages_by_id ON am_messages (message_id);
