-- Switchboard profile database: the ASNET/1 client (issue 18). Same house rules as 0001.
-- The mailbox password lives in the profile's keystore (slot `asnet`), never here. A challenge
-- code is kept only while its review is pending and is emptied once decided or expired.

-- The profile's one ASNET account: the service mailbox, the user's own mailbox and its servers,
-- and what the service told us (member id, discovery) and where reading the mailbox stopped.
CREATE TABLE asnet_account (
    id           INTEGER PRIMARY KEY CHECK (id = 1),
    service      TEXT NOT NULL,
    mailbox      TEXT NOT NULL,
    username     TEXT NOT NULL,
    smtp_host    TEXT NOT NULL,
    smtp_port    INTEGER NOT NULL,
    smtp_tls     TEXT NOT NULL CHECK (smtp_tls IN ('tls', 'starttls', 'none')),
    smtp_auth    INTEGER NOT NULL DEFAULT 1,
    imap_host    TEXT NOT NULL,
    imap_port    INTEGER NOT NULL,
    imap_tls     TEXT NOT NULL CHECK (imap_tls IN ('tls', 'none')),
    member_id    TEXT NOT NULL DEFAULT '',
    discovery    INTEGER NOT NULL DEFAULT 0,
    uid_validity INTEGER NOT NULL DEFAULT 0,
    last_uid     INTEGER NOT NULL DEFAULT 0,
    last_sync_at INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT NOT NULL DEFAULT '',
    created_at   INTEGER NOT NULL
) STRICT;

-- Every protected command this profile sent: the exact action (the command's JSON), who asked,
-- and how far it got. Only a `sent` request can be matched by a challenge.
CREATE TABLE asnet_requests (
    id           INTEGER PRIMARY KEY,
    action       TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    state        TEXT NOT NULL DEFAULT 'sent' CHECK (state IN ('sent', 'challenged', 'verified', 'rejected')),
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
) STRICT;

-- Service replies read from the mailbox, one per response id (deduplication). Challenge codes
-- are blanked in the stored body.
CREATE TABLE asnet_replies (
    response_id TEXT PRIMARY KEY,
    type        TEXT NOT NULL,
    body        TEXT NOT NULL,
    received_at INTEGER NOT NULL
) STRICT;

-- Challenges: `pending` waits for the owner (a review_queue row points here), `warning` was
-- unsolicited or for another action and is never answered.
CREATE TABLE asnet_challenges (
    challenge_id TEXT PRIMARY KEY,
    request_id   INTEGER REFERENCES asnet_requests(id),
    action       TEXT NOT NULL,
    code         TEXT NOT NULL DEFAULT '',
    expires_at   INTEGER NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('pending', 'verified', 'rejected', 'expired', 'warning')),
    response_id  TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    decided_at   INTEGER NOT NULL DEFAULT 0
) STRICT;

-- Invitations from other members: the owner accepts them (with the same or fewer scopes) or
-- lets them expire.
CREATE TABLE asnet_invitations (
    request_id  TEXT PRIMARY KEY,
    from_member TEXT NOT NULL,
    scopes      TEXT NOT NULL,
    expires_at  INTEGER NOT NULL,
    state       TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'accepting', 'accepted')),
    received_at INTEGER NOT NULL
) STRICT;

-- The connection list as the service last reported it (CONNECTED, CONNECTIONS, DISCONNECTED).
CREATE TABLE asnet_connections (
    member_id  TEXT PRIMARY KEY,
    scopes     TEXT NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;

-- Mail that was refused (not from the service, malformed, a duplicate response id) and
-- challenges that were never answered. The mail itself stays in the mailbox untouched.
CREATE TABLE asnet_warnings (
    id         INTEGER PRIMARY KEY,
    kind       TEXT NOT NULL,
    detail     TEXT NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;

-- The review queue also holds ASNET challenges for the owner: exactly one of `contact_id` (a
-- 1:1 send), `group_id` (a group send) and `asnet_challenge` is set. Rebuilt as in 0005.
CREATE TABLE review_queue_new (
    id              INTEGER PRIMARY KEY,
    agent           TEXT NOT NULL,
    contact_id      INTEGER REFERENCES contacts(id) ON DELETE CASCADE,
    group_id        TEXT,
    to_fp           TEXT,
    asnet_challenge TEXT REFERENCES asnet_challenges(challenge_id),
    kind            TEXT NOT NULL,
    body            TEXT NOT NULL,
    reply_to        TEXT,
    to_agent        TEXT,
    state           TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'approved', 'rejected')),
    message_id      TEXT,
    created_at      INTEGER NOT NULL,
    decided_at      INTEGER NOT NULL DEFAULT 0,
    CHECK ((contact_id IS NOT NULL) + (group_id IS NOT NULL) + (asnet_challenge IS NOT NULL) = 1)
) STRICT;
INSERT INTO review_queue_new (id, agent, contact_id, group_id, to_fp, kind, body, reply_to, to_agent, state,
    message_id, created_at, decided_at)
SELECT id, agent, contact_id, group_id, to_fp, kind, body, reply_to, to_agent, state, message_id, created_at,
    decided_at
FROM review_queue;
DROP TABLE review_queue;
ALTER TABLE review_queue_new RENAME TO review_queue;
CREATE INDEX review_queue_pending ON review_queue (state, id);
