-- A per-mailbox count of waiting envelopes (the SQLite side is
-- migrations/0007_letagents_waiting_counter.sql, same meaning), so a deposit's capacity check reads
-- the mailbox row it locks instead of counting the mailbox's envelopes: a `COUNT(*)` per deposit
-- grew with the backlog, under the mailbox's lock.
--
-- Triggers keep it (and `next_seq`) in step with `la_envelope` in every statement that inserts or
-- deletes an envelope (a deposit, an ack, the retention sweep, a cascade), so no write path can
-- forget it. They also let a deposit be one statement:
-- `INSERT … SELECT … FROM la_mailbox WHERE <drop and capacity hold> FOR UPDATE RETURNING seq`.
ALTER TABLE la_mailbox ADD COLUMN waiting BIGINT NOT NULL DEFAULT 0;

UPDATE la_mailbox SET waiting = (SELECT COUNT(*) FROM la_envelope e WHERE e.mailbox = la_mailbox.id);

CREATE FUNCTION la_envelope_deposited() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE la_mailbox SET waiting = waiting + 1, next_seq = GREATEST(next_seq, NEW.seq + 1)
    WHERE id = NEW.mailbox;
    RETURN NULL;
END
$$;

CREATE FUNCTION la_envelope_removed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE la_mailbox SET waiting = waiting - 1 WHERE id = OLD.mailbox;
    RETURN NULL;
END
$$;

CREATE TRIGGER la_envelope_deposited AFTER INSERT ON la_envelope
    FOR EACH ROW EXECUTE FUNCTION la_envelope_deposited();

CREATE TRIGGER la_envelope_removed AFTER DELETE ON la_envelope
    FOR EACH ROW EXECUTE FUNCTION la_envelope_removed();
