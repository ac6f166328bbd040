-- A delivery is one read and one statement that stores: `INSERT INTO am_packets … SELECT
-- next_seq FROM am_mailboxes … RETURNING seq`. This trigger advances the mailbox's `next_seq`
-- and its quota counters (migration 0006) in that same statement, instead of a separate
-- `UPDATE … RETURNING` before the insert. Deleting a packet's body and the sweep keep adjusting
-- the counters as before.
CREATE TRIGGER am_packet_accepted AFTER INSERT ON am_packets
BEGIN
    UPDATE am_mailboxes SET
        next_seq = max(next_seq, NEW.seq + 1),
        stored_packets = stored_packets + (NEW.body IS NOT NULL),
        stored_bytes = stored_bytes + CASE WHEN NEW.body IS NULL THEN 0 ELSE NEW.size END
    WHERE mailbox_id = NEW.mailbox_id;
END;
