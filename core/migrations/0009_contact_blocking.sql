-- Switchboard profile database: blocked senders. Same house rules as 0001.

-- A blocked contact stays a row (so the same peer cannot come back as a new request) and keeps
-- its state (`active`, or `pending` for a denied request); while `blocked` is 1, whatever it
-- sends is dropped before it reaches any agent, counted in `blocked_dropped` and audited, and
-- nothing can be sent to it. `contact unblock` clears the flag.
ALTER TABLE contacts ADD COLUMN blocked INTEGER NOT NULL DEFAULT 0 CHECK (blocked IN (0, 1));
ALTER TABLE contacts ADD COLUMN blocked_at INTEGER NOT NULL DEFAULT 0;
ALTER TABLE contacts ADD COLUMN blocked_dropped INTEGER NOT NULL DEFAULT 0;
