-- Switchboard profile database: how far each agent's queue has looked. Same house rules as 0001.

-- Every incoming message at or below `scanned_rowid` has been considered by the agent's queue
-- (classified into agent_deliveries, or not a candidate when it was looked at), so the queue
-- looks only above it and no longer rescans the whole history on every wait. A message that
-- becomes a candidate later with an older row (a request's held messages, released when the
-- contact is accepted) moves the mark back below itself, by the triggers below, whichever code
-- path released it.
ALTER TABLE agent_floors ADD COLUMN scanned_rowid INTEGER NOT NULL DEFAULT 0;

CREATE TRIGGER agent_scan_mark_on_release AFTER UPDATE OF state ON messages
WHEN NEW.direction = 'in' AND NEW.state = 'received' AND OLD.state != 'received'
BEGIN
    UPDATE agent_floors SET scanned_rowid = NEW.rowid_ - 1 WHERE scanned_rowid >= NEW.rowid_;
END;

-- Rows are appended (rowids only grow), so an insert lands above every mark; this covers a
-- reused rowid all the same.
CREATE TRIGGER agent_scan_mark_on_insert AFTER INSERT ON messages
WHEN NEW.direction = 'in' AND NEW.state = 'received'
BEGIN
    UPDATE agent_floors SET scanned_rowid = NEW.rowid_ - 1 WHERE scanned_rowid >= NEW.rowid_;
END;
