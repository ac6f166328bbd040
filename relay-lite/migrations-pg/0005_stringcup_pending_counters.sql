-- Per-inbox and per-(inbox, sender) counters of pending Stringcup messages and their bytes (the
-- SQLite side is migrations/0008_stringcup_pending_counters.sql, same meaning): a send's
-- pending-limit check reads two rows, under the recipient's row lock, instead of counting and
-- summing the inbox's messages. Triggers keep them in step with `sc_message` in every statement
-- that inserts or deletes a message (a send, an ack, a cascade). A share row exists while its
-- sender has messages pending in the inbox. Every writer of an inbox's messages holds that
-- inbox's batch lock (a send, an ack) or the sweep lock, so the counter rows are never contended
-- in another order.
ALTER TABLE sc_identity ADD COLUMN pending_messages BIGINT NOT NULL DEFAULT 0;
ALTER TABLE sc_identity ADD COLUMN pending_bytes BIGINT NOT NULL DEFAULT 0;

CREATE TABLE sc_pending_share (
    recipient TEXT   NOT NULL REFERENCES sc_identity (id) ON DELETE CASCADE,
    sender    TEXT   NOT NULL,
    messages  BIGINT NOT NULL,
    bytes     BIGINT NOT NULL,
    PRIMARY KEY (recipient, sender)
);

UPDATE sc_identity SET
    pending_messages = (SELECT COUNT(*) FROM sc_message m WHERE m.recipient = sc_identity.id),
    pending_bytes = (SELECT COALESCE(SUM(m.size), 0) FROM sc_message m WHERE m.recipient = sc_identity.id);

INSERT INTO sc_pending_share (recipient, sender, messages, bytes)
    SELECT recipient, sender, COUNT(*), SUM(size) FROM sc_message GROUP BY recipient, sender;

-- Only the pending counts read this index; the counters replace them.
DROP INDEX sc_message_share;

CREATE FUNCTION sc_message_pending_added() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sc_identity SET pending_messages = pending_messages + 1, pending_bytes = pending_bytes + NEW.size
    WHERE id = NEW.recipient;
    INSERT INTO sc_pending_share (recipient, sender, messages, bytes) VALUES (NEW.recipient, NEW.sender, 1, NEW.size)
    ON CONFLICT (recipient, sender) DO UPDATE
    SET messages = sc_pending_share.messages + 1, bytes = sc_pending_share.bytes + EXCLUDED.bytes;
    RETURN NULL;
END
$$;

CREATE FUNCTION sc_message_pending_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sc_identity SET pending_messages = pending_messages - 1, pending_bytes = pending_bytes - OLD.size
    WHERE id = OLD.recipient;
    DELETE FROM sc_pending_share WHERE recipient = OLD.recipient AND sender = OLD.sender AND messages <= 1;
    UPDATE sc_pending_share SET messages = messages - 1, bytes = bytes - OLD.size
    WHERE recipient = OLD.recipient AND sender = OLD.sender;
    RETURN NULL;
END
$$;

CREATE TRIGGER sc_message_pending_added AFTER INSERT ON sc_message
    FOR EACH ROW EXECUTE FUNCTION sc_message_pending_added();

CREATE TRIGGER sc_message_pending_removed AFTER DELETE ON sc_message
    FOR EACH ROW EXECUTE FUNCTION sc_message_pending_removed();
