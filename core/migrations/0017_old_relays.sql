-- Switchboard profile database, version 17: relays the profile moved away from (`relay move`).
-- Same house rules as 0001.

-- One row per relay the profile's own mailboxes lived on before a move: until `drain_until`
-- (Unix ms; the move's time plus letagents' 48 h retention) the runtime still reads its letagents
-- inbox and Agent Mail mailbox there, so what peers sent before they learned the move is not
-- lost. A connection to it verifies against `trusted_relays` (the move carries the old relay's
-- certificate pin there as the owner's vouch). Moving back to a relay deletes its row.
CREATE TABLE old_relays (
    url         TEXT PRIMARY KEY,
    moved_at    INTEGER NOT NULL,
    drain_until INTEGER NOT NULL
) STRICT;
