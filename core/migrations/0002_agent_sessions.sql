-- Switchboard profile database, version 2: agent sessions, the per-agent delivery queue, the
-- loop guard and outbound review. Same house rules as 0001.

-- Bearer tokens of local agent sessions. Only a SHA-256 of each token is kept; a token is bound
-- to one agent name. Tokens die with the runtime that issued them (the bridge clears them).
CREATE TABLE agent_tokens (
    token_hash BLOB PRIMARY KEY,
    agent      TEXT NOT NULL REFERENCES agents(name) ON DELETE CASCADE,
    harness    TEXT NOT NULL DEFAULT '',
    created_at INTEGER NOT NULL
) STRICT;
CREATE INDEX agent_tokens_by_agent ON agent_tokens (agent);

-- Where an agent's queue starts: messages at or below this row are never delivered to it (a new
-- agent catches up on the last few only).
CREATE TABLE agent_floors (
    agent       TEXT PRIMARY KEY REFERENCES agents(name) ON DELETE CASCADE,
    floor_rowid INTEGER NOT NULL
) STRICT;

-- Every incoming message an agent's queue has considered, and what became of it: `steer`
-- (addressed to the agent: due at once), `digest` (other traffic: due on the next digest tick),
-- `none` (addressed to another local agent). `paused` waits for the operator (loop guard).
CREATE TABLE agent_deliveries (
    agent        TEXT NOT NULL REFERENCES agents(name) ON DELETE CASCADE,
    message      INTEGER NOT NULL REFERENCES messages(rowid_) ON DELETE CASCADE,
    mode         TEXT NOT NULL CHECK (mode IN ('steer', 'digest', 'none')),
    state        TEXT NOT NULL CHECK (state IN ('queued', 'paused', 'delivered', 'skipped')),
    due_at       INTEGER NOT NULL,
    delivered_at INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (agent, message)
) STRICT;
CREATE INDEX agent_deliveries_queued ON agent_deliveries (agent, state, due_at);

-- Per-contact conversation state: hops of the loop guard are counted after `reset_rowid` (the
-- last operator input); `outbound` overrides the global review policy for this contact.
CREATE TABLE conversations (
    contact_id  INTEGER PRIMARY KEY REFERENCES contacts(id) ON DELETE CASCADE,
    reset_rowid INTEGER NOT NULL DEFAULT 0,
    outbound    TEXT NOT NULL DEFAULT 'default' CHECK (outbound IN ('default', 'auto', 'review'))
) STRICT;

-- Outbound agent messages held for the operator's approval (review mode).
CREATE TABLE review_queue (
    id         INTEGER PRIMARY KEY,
    agent      TEXT NOT NULL,
    contact_id INTEGER NOT NULL REFERENCES contacts(id) ON DELETE CASCADE,
    kind       TEXT NOT NULL,
    body       TEXT NOT NULL,
    reply_to   TEXT,
    to_agent   TEXT,
    state      TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'approved', 'rejected')),
    message_id TEXT,
    created_at INTEGER NOT NULL,
    decided_at INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE INDEX review_queue_pending ON review_queue (state, id);
