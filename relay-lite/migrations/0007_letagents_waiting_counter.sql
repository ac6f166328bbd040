-- A per-mailbox count of waiting envelopes, so a deposit's capacity check reads one row instead
-- of counting the mailbox's envelopes (a `COUNT(*)` per deposit grew with the backlog: 26 µs at
-- 1,000 waiting, 138 µs at 6,000, on the single writer).
--
-- Triggers keep it (and `next_seq`) in step with `la_envelope` inside whatever statement inserts
-- or deletes an envelope (a deposit, an ack, the retention sweep, a cascade), so no write path can
-- forget it. They also let a deposit be one statement:
-- `INSERT … SELECT … FROM la_mailbox WHERE <drop and capacity hold> RETURNING seq`.
ALTER TABLE la_mailbox ADD COLUMN waiting INTEGER NOT NULL DEFAULT 0;

UPDATE la_mailbox SET waiting = (SELECT COUNT(*) FROM la_envelope e WHERE e.mailbox = la_mailbox.id);

CREATE TRIGGER la_envelope_deposited AFTER INSERT ON la_envelope
BEGIN
    UPDATE la_mailbox SET waiting = waiting + 1, next_seq = max(next_seq, NEW.seq + 1)
    WHERE id = NEW.mailbox;
END;

CREATE TRIGGER la_envelope_removed AFTER DELETE ON la_envelope
BEGIN
    UPDATE la_mailbox SET waiting = waiting - 1 WHERE id = OLD.mailbox;
END;
