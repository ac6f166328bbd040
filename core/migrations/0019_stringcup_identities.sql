-- Switchboard profile database, version 19: one Stringcup identity per relay (a relay move keeps
-- the identity the old relay assigned, for the Stringcup contacts that live there). Same house
-- rules as 0001.

-- One row per Stringcup identity this profile holds, keyed by the relay that assigned it
-- (canonical URL, no trailing slash). `slot` names the keystore slot holding its X25519 key(s)
-- and API token (`stringcup` for the profile's first identity, `stringcup@<8 hex of SHA-256 of
-- the URL>` for later ones); the row is written only after the slot. The identity of the
-- profile's own relay (`meta.relay_url`) is the current one: new contacts, pairing and topics
-- use it. Every other row is an identity kept after a move: Stringcup contacts stored with that
-- relay (`contacts.relay_url`) are still reached, and read, through it. A row is never deleted by
-- a move (moving back to a relay reuses its identity).
CREATE TABLE stringcup_identities (
    relay_url  TEXT PRIMARY KEY,
    sc_id      TEXT NOT NULL,
    slot       TEXT NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

-- The identity registered before this version (`meta.stringcup_id`, slot `stringcup`) belongs
-- to the profile's relay at this point.
INSERT INTO stringcup_identities (relay_url, sc_id, slot, created_at)
SELECT rtrim(r.value, '/'), s.value, 'stringcup', 0
FROM meta s, meta r
WHERE s.key = 'stringcup_id' AND r.key = 'relay_url';

DELETE FROM meta WHERE key = 'stringcup_id';
