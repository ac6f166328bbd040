-- Switchboard profile database, version 1.
-- House rules: STRICT tables, NOT NULL with defaults, INSERTs name their columns,
-- columns are never repurposed (add a migration instead).

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

-- Every peer we know or that asked to know us, whatever the protocol.
CREATE TABLE contacts (
    id              INTEGER PRIMARY KEY,
    name            TEXT NOT NULL UNIQUE,
    protocol        TEXT NOT NULL,
    peer_id         TEXT NOT NULL,              -- letagents: mailbox id
    address         TEXT NOT NULL,              -- what the user shared (full address)
    sig_pub         BLOB NOT NULL,
    box_pub         BLOB NOT NULL,
    drop_code       BLOB,
    relay_url       TEXT,                       -- NULL: our own relay
    state           TEXT NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'pending')),
    allow_kinds     TEXT NOT NULL DEFAULT 'send,ask,reply,list',
    verified        INTEGER NOT NULL DEFAULT 0,
    changed_box_pub BLOB,                       -- a different box key seen for this id
    key_changed_at  INTEGER,
    roster          TEXT NOT NULL DEFAULT '[]', -- their last roster (JSON)
    request_body    TEXT NOT NULL DEFAULT '',   -- the hello's self-given name
    created_at      INTEGER NOT NULL,
    UNIQUE (protocol, peer_id)
) STRICT;

CREATE TABLE agent_rules (
    id         INTEGER PRIMARY KEY,
    contact_id INTEGER NOT NULL REFERENCES contacts(id) ON DELETE CASCADE,
    position   INTEGER NOT NULL,
    from_glob  TEXT NOT NULL,
    to_glob    TEXT NOT NULL,
    action     TEXT NOT NULL CHECK (action IN ('allow', 'deny'))
) STRICT;
CREATE INDEX agent_rules_by_contact ON agent_rules (contact_id, position);

-- Messages sent and received (content). State: queued, relayed, delivered, refused, failed
-- for outgoing; received for incoming.
CREATE TABLE messages (
    rowid_      INTEGER PRIMARY KEY,
    id          TEXT NOT NULL,
    direction   TEXT NOT NULL CHECK (direction IN ('in', 'out')),
    protocol    TEXT NOT NULL,
    contact_id  INTEGER REFERENCES contacts(id) ON DELETE SET NULL,
    peer        TEXT NOT NULL,
    kind        TEXT NOT NULL,
    body        TEXT NOT NULL,
    reply_to    TEXT,
    from_agent  TEXT,
    to_agent    TEXT,
    ts          INTEGER NOT NULL,
    state       TEXT NOT NULL,
    detail      TEXT NOT NULL DEFAULT '',
    shown       INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    UNIQUE (direction, protocol, peer, id)
) STRICT;
CREATE INDEX messages_unshown ON messages (direction, shown);

-- Durable replay protection: (sender, id) pairs already processed.
CREATE TABLE seen (
    protocol TEXT NOT NULL,
    peer     TEXT NOT NULL,
    id       TEXT NOT NULL,
    ts       INTEGER NOT NULL,
    PRIMARY KEY (protocol, peer, id)
) STRICT;
CREATE INDEX seen_by_ts ON seen (ts);

-- Durable outbox: a payload committed before anything is sent, retried until the relay takes it.
CREATE TABLE outbox (
    id              INTEGER PRIMARY KEY,
    message_id      TEXT NOT NULL,
    protocol        TEXT NOT NULL,
    kind            TEXT NOT NULL,
    relay_url       TEXT NOT NULL,
    target          TEXT NOT NULL,
    drop_code       BLOB NOT NULL,
    payload         BLOB NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    last_error      TEXT NOT NULL DEFAULT '',
    created_at      INTEGER NOT NULL
) STRICT;
CREATE INDEX outbox_due ON outbox (next_attempt_at);

-- Audit log: every state a message passed through, and every refusal or drop.
CREATE TABLE audit (
    id         INTEGER PRIMARY KEY,
    at         INTEGER NOT NULL,
    direction  TEXT NOT NULL,
    protocol   TEXT NOT NULL,
    peer       TEXT NOT NULL,
    message_id TEXT NOT NULL,
    kind       TEXT NOT NULL,
    state      TEXT NOT NULL,
    detail     TEXT NOT NULL DEFAULT ''
) STRICT;

-- Local agent sessions (the roster we report).
CREATE TABLE agents (
    name       TEXT PRIMARY KEY,
    harness    TEXT NOT NULL DEFAULT 'cli',
    status     TEXT NOT NULL DEFAULT 'online',
    where_     TEXT NOT NULL DEFAULT '',
    updated_at INTEGER NOT NULL
) STRICT;
