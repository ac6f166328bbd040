-- A send takes the sender's next sent number in its `INSERT … SELECT` (joining the sender's row),
-- and this trigger advances it, as `sc_message_pending_added` advances the recipient's
-- `next_inbox_id`: one statement per stored message where there were two (an `UPDATE …
-- RETURNING` of the sender's counter first). `max` keeps the counter from ever going back.
CREATE TRIGGER sc_message_sent_seq AFTER INSERT ON sc_message
BEGIN
    UPDATE sc_identity SET next_sent_seq = max(next_sent_seq, NEW.sent_seq + 1) WHERE id = NEW.sender;
END;
