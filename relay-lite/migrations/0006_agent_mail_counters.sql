-- Per-mailbox counters of stored (undeleted) packets and their bytes, kept in the writer's
-- transaction on delivery, delete and sweep, so the quota check reads one row instead of
-- counting the mailbox's packets. They include packets that expired but are not swept yet, so
-- they bound the quota's figures (undeleted, unexpired) from above: under the quota by the
-- counters means under it exactly; otherwise the writer counts exactly.
ALTER TABLE am_mailboxes ADD COLUMN stored_packets INTEGER NOT NULL DEFAULT 0;
ALTER TABLE am_mailboxes ADD COLUMN stored_bytes INTEGER NOT NULL DEFAULT 0;

UPDATE am_mailboxes SET
    stored_packets = (SELECT COUNT(*) FROM am_packets p
                      WHERE p.mailbox_id = am_mailboxes.mailbox_id AND p.body IS NOT NULL),
    stored_bytes = (SELECT COALESCE(SUM(p.size), 0) FROM am_packets p
                    WHERE p.mailbox_id = am_mailboxes.mailbox_id AND p.body IS NOT NULL);
