-- ASNET/1 service state (relay-lite/src/asnet/store.rs), in its own database file `asnet.sqlite3`.
-- Ids are the 16 random bytes of `mem_`/`chl_`/`req_`/`rsp_` ids; times are Unix ms.

-- Delivery ids seen in the last 24 h (malformed and failed commands included).
CREATE TABLE asnet_deliveries (
    delivery_id TEXT PRIMARY KEY NOT NULL,
    at INTEGER NOT NULL
) STRICT;

-- Admitted attempts, for the rolling-hour budgets.
CREATE TABLE asnet_attempts (
    id INTEGER PRIMARY KEY,
    sender TEXT NOT NULL,
    at INTEGER NOT NULL
) STRICT;
CREATE INDEX asnet_attempts_sender_at ON asnet_attempts (sender, at);
CREATE INDEX asnet_attempts_at ON asnet_attempts (at);

CREATE TABLE asnet_members (
    id BLOB PRIMARY KEY NOT NULL,
    mailbox TEXT NOT NULL UNIQUE,
    discovery INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL
) STRICT;

-- Challenges keep only the code's hash; `action` is the exact command text.
CREATE TABLE asnet_challenges (
    id BLOB PRIMARY KEY NOT NULL,
    mailbox TEXT NOT NULL,
    action TEXT NOT NULL,
    code_hash BLOB NOT NULL,
    expires_at INTEGER NOT NULL,
    wrong_guesses INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL
) STRICT;

-- Pending offers; `low`/`high` is the unordered pair for lookups in either direction.
CREATE TABLE asnet_offers (
    id BLOB PRIMARY KEY NOT NULL,
    from_member BLOB NOT NULL,
    to_member BLOB NOT NULL,
    low BLOB NOT NULL,
    high BLOB NOT NULL,
    scopes TEXT NOT NULL,
    expires_at INTEGER NOT NULL
) STRICT;
CREATE INDEX asnet_offers_pair ON asnet_offers (low, high);

-- Undirected edges, one row per pair (low < high).
CREATE TABLE asnet_edges (
    low BLOB NOT NULL,
    high BLOB NOT NULL,
    scopes TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (low, high)
) STRICT;
CREATE INDEX asnet_edges_high ON asnet_edges (high);

-- The reply outbox; rows are written in the same transaction as the state change that made
-- them. `body` is emptied once the entry is sent, dead or expired.
CREATE TABLE asnet_outbox (
    seq INTEGER PRIMARY KEY,
    response_id BLOB NOT NULL UNIQUE,
    to_mailbox TEXT NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    failures INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    state TEXT NOT NULL
) STRICT;
CREATE INDEX asnet_outbox_state ON asnet_outbox (state, seq);

-- The global send pacing (one row).
CREATE TABLE asnet_pacer (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    last_send_at INTEGER
) STRICT;
INSERT INTO asnet_pacer (id, last_send_at) VALUES (1, NULL);
