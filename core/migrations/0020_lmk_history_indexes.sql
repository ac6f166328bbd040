-- Switchboard profile database, version 20: what a group's log is asked on every message sent or
-- received stops growing with the group's history. Same house rules as 0001.
--
-- Two of them filtered on columns no index held, so SQLite read every row of the group (or of
-- the session) through `UNIQUE (handle, group_id, id)`: with 20,000 messages in one group, the
-- leave requests to honour took ~27 ms and the loop guard's hops ~10 ms per message received.
-- Partial indexes hold only the rows asked about; SQLite keeps the rowid in every index, so the
-- hops after the last operator input are a range of this index, read only as far as the limit.

-- Leave requests from other members (`group_leavers`).
CREATE INDEX lmk_messages_leaves ON lmk_messages (handle, group_id) WHERE kind = 'leave' AND outgoing = 0;

-- The loop guard's hops: every group message, in or out, once done (`group_hop_thresholds`,
-- `group_hops`).
CREATE INDEX lmk_messages_hops ON lmk_messages (handle, group_id) WHERE kind = 'message' AND state = 'done';

-- Membership events (`group_join_seq`, the frontier's start): a few per group.
CREATE INDEX lmk_messages_events ON lmk_messages (handle, group_id) WHERE kind = 'event';

-- The read frontier (the tips of what a session has read, the `after` of its next message) was
-- found by reading every read message since the session joined and parsing each one's `after`:
-- ~35 ms per send in a group of 20,000 messages. A row is now marked `covered` once a read
-- message names it in `after`, by the triggers below whatever path reads a row (acks, the
-- owner's look, a reply, an own send once posted); the frontier is the read rows not covered,
-- which a partial index holds alone. A row named before it is stored or read is marked all the
-- same (the triggers mark by id), so reading out of order changes nothing.
ALTER TABLE lmk_messages ADD COLUMN covered INTEGER NOT NULL DEFAULT 0;

UPDATE lmk_messages SET covered = 1 WHERE (handle, group_id, id) IN (
    SELECT c.handle, c.group_id, j.value FROM lmk_messages AS c, json_each(c.after) AS j
    WHERE c.read = 1 AND c.state = 'done' AND c.kind IN ('message', 'leave') AND json_valid(c.after)
);

CREATE TRIGGER lmk_messages_covered_by_insert AFTER INSERT ON lmk_messages
WHEN NEW.read = 1 AND NEW.state = 'done' AND NEW.kind IN ('message', 'leave') AND json_valid(NEW.after)
BEGIN
    UPDATE lmk_messages SET covered = 1
    WHERE handle = NEW.handle AND group_id = NEW.group_id AND covered = 0
        AND id IN (SELECT value FROM json_each(NEW.after));
END;

CREATE TRIGGER lmk_messages_covered_by_read AFTER UPDATE OF read, state ON lmk_messages
WHEN NEW.read = 1 AND NEW.state = 'done' AND NEW.kind IN ('message', 'leave') AND json_valid(NEW.after)
    AND (OLD.read = 0 OR OLD.state != 'done')
BEGIN
    UPDATE lmk_messages SET covered = 1
    WHERE handle = NEW.handle AND group_id = NEW.group_id AND covered = 0
        AND id IN (SELECT value FROM json_each(NEW.after));
END;

CREATE INDEX lmk_messages_tips ON lmk_messages (handle, group_id)
WHERE read = 1 AND covered = 0 AND state = 'done' AND kind IN ('message', 'leave');
