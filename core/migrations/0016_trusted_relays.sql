-- Switchboard profile database, version 16: relays trusted by certificate pin besides the
-- profile's own (issue 17: groups on a LAN without internet). Same house rules as 0001.

-- One pin per relay URL (canonical, no trailing slash): the SHA-256 of the certificate's DER
-- that a connection to that URL must present. `source` says who vouched for it: `contact`, a
-- pinned contact whose identity key signed a LAN announcement of it (`contact_id`; the pin goes
-- with the contact), or `user`, the owner who accepted it after seeing the URL and the
-- certificate's SHA-256 (`contact_id` NULL). A later vouch for the same URL replaces the row.
-- `expires_at` is the announcement's expiry (0 for the user's), kept for display: the pin itself
-- lasts, as a certificate pin does.
CREATE TABLE trusted_relays (
    url         TEXT PRIMARY KEY,
    cert_sha256 BLOB NOT NULL CHECK (length(cert_sha256) = 32),
    source      TEXT NOT NULL CHECK (source IN ('contact', 'user')),
    contact_id  INTEGER REFERENCES contacts(id) ON DELETE CASCADE,
    expires_at  INTEGER NOT NULL DEFAULT 0,
    updated_at  INTEGER NOT NULL,
    CHECK ((source = 'contact') = (contact_id IS NOT NULL))
) STRICT;
