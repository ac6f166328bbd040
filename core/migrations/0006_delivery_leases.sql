-- Switchboard profile database: agent deliveries are handed out under a lease. Same house rules
-- as 0001.

-- A `wait` or `read` hands queued rows out as `handed`, under a random `lease` id taken at
-- `leased_at`; the adapter's `ack` of that lease makes them `delivered`. A lease not acked within
-- the lease timeout is handed out again (`handed_count` > 1 marks the items as redelivered), so an
-- adapter that dies between taking messages and giving them to its harness loses nothing.
-- SQLite cannot widen a CHECK constraint in place: the table is rebuilt with the same rows.
CREATE TABLE agent_deliveries_new (
    agent        TEXT NOT NULL REFERENCES agents(name) ON DELETE CASCADE,
    message      INTEGER NOT NULL REFERENCES messages(rowid_) ON DELETE CASCADE,
    mode         TEXT NOT NULL CHECK (mode IN ('steer', 'digest', 'none')),
    state        TEXT NOT NULL CHECK (state IN ('queued', 'paused', 'handed', 'delivered', 'skipped')),
    due_at       INTEGER NOT NULL,
    delivered_at INTEGER NOT NULL DEFAULT 0,
    lease        TEXT NOT NULL DEFAULT '',
    leased_at    INTEGER NOT NULL DEFAULT 0,
    handed_count INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (agent, message)
) STRICT;
INSERT INTO agent_deliveries_new (agent, message, mode, state, due_at, delivered_at)
    SELECT agent, message, mode, state, due_at, delivered_at FROM agent_deliveries;
DROP TABLE agent_deliveries;
ALTER TABLE agent_deliveries_new RENAME TO agent_deliveries;
CREATE INDEX agent_deliveries_queued ON agent_deliveries (agent, state, due_at);
CREATE INDEX agent_deliveries_lease ON agent_deliveries (lease) WHERE lease != '';
