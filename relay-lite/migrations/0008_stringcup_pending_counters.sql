-- Per-inbox and per-(inbox, sender) counters of pending Stringcup messages and their bytes, so a
-- send's pending-limit check reads two rows instead of counting and summing the inbox's messages
-- twice (`COUNT(*)`, `SUM(size)` over `sc_message_share`, per recipient and per sender), on the
-- single writer.
--
-- Triggers keep them in step with `sc_message` inside whatever statement inserts or deletes a
-- message (a send, an ack, a cascade when an identity is reclaimed), as migration 0007 does for
-- letagents, so no write path can forget them. A share row exists while its sender has messages
-- pending in the inbox.
ALTER TABLE sc_identity ADD COLUMN pending_messages INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sc_identity ADD COLUMN pending_bytes INTEGER NOT NULL DEFAULT 0;

CREATE TABLE sc_pending_share (
    recipient TEXT    NOT NULL REFERENCES sc_identity (id) ON DELETE CASCADE,
    sender    TEXT    NOT NULL,
    messages  INTEGER NOT NULL,
    bytes     INTEGER NOT NULL,
    PRIMARY KEY (recipient, sender)
) STRICT, WITHOUT ROWID;

UPDATE sc_identity SET
    pending_messages = (SELECT COUNT(*) FROM sc_message m WHERE m.recipient = sc_identity.id),
    pending_bytes = (SELECT COALESCE(SUM(m.size), 0) FROM sc_message m WHERE m.recipient = sc_identity.id);

INSERT INTO sc_pending_share (recipient, sender, messages, bytes)
    SELECT recipient, sender, COUNT(*), SUM(size) FROM sc_message GROUP BY recipient, sender;

-- Only the pending counts read this index; the counters replace them.
DROP INDEX sc_message_share;

-- It also advances the recipient's `next_inbox_id` past the stored number, so a send takes the
-- number in its `INSERT … SELECT next_inbox_id` without a separate `UPDATE`.
CREATE TRIGGER sc_message_pending_added AFTER INSERT ON sc_message
BEGIN
    UPDATE sc_identity SET pending_messages = pending_messages + 1, pending_bytes = pending_bytes + NEW.size,
        next_inbox_id = max(next_inbox_id, NEW.id + 1)
    WHERE id = NEW.recipient;
    INSERT INTO sc_pending_share (recipient, sender, messages, bytes) VALUES (NEW.recipient, NEW.sender, 1, NEW.size)
    ON CONFLICT (recipient, sender) DO UPDATE SET messages = messages + 1, bytes = bytes + excluded.bytes;
END;

CREATE TRIGGER sc_message_pending_removed AFTER DELETE ON sc_message
BEGIN
    UPDATE sc_identity SET pending_messages = pending_messages - 1, pending_bytes = pending_bytes - OLD.size
    WHERE id = OLD.recipient;
    UPDATE sc_pending_share SET messages = messages - 1, bytes = bytes - OLD.size
    WHERE recipient = OLD.recipient AND sender = OLD.sender;
    DELETE FROM sc_pending_share WHERE recipient = OLD.recipient AND sender = OLD.sender AND messages <= 0;
END;

-- The lifetime statistic, counted by the same statement that stores the message.
CREATE TRIGGER sc_message_counted AFTER INSERT ON sc_message
BEGIN
    UPDATE sc_counter SET value = value + 1 WHERE name = 'messages_stored';
END;
