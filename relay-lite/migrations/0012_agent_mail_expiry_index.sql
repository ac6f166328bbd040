-- Agent Mail packets by expiry, as PostgreSQL's schema has them (`am_packets_expires`): the
-- sweep deleted expired packets with a scan of every packet and then recounted every mailbox's
-- packets, holding the single writer for the whole of both (with 100,000 packets of 3.3 KB,
-- ~0.5 s warm and ~0.8 s cold, every minute, during which no write of any protocol committed).
-- The sweep now deletes through this index and lowers the counters of the mailboxes it freed
-- from the rows it deleted.
CREATE INDEX am_packets_expires ON am_packets (expires_at);

-- The mailboxes a sweep forgets (their card's `receive_until` passed), as on PostgreSQL too.
CREATE INDEX am_mailboxes_receive_until ON am_mailboxes (receive_until);
