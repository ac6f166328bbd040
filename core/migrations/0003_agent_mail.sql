-- Switchboard profile database, version 3: Agent Mail 1.0. Same house rules as 0001.
-- Secrets (the Agent ID seed and every card's X25519 secret) live in the keystore, never here.

-- Our own mailbox cards, as signed (JCS). The newest nonce is the current card; older ones are
-- retained until their receive_until so mail queued under them still opens.
CREATE TABLE am_own_cards (
    card_hash     TEXT PRIMARY KEY,
    nonce         INTEGER NOT NULL,
    public_key    TEXT NOT NULL,
    expires_at    INTEGER NOT NULL,
    receive_until INTEGER NOT NULL,
    card          BLOB NOT NULL,
    published_at  INTEGER NOT NULL DEFAULT 0,
    created_at    INTEGER NOT NULL
) STRICT;

-- Sender-side pins: per (owner, mailbox) the valid card with the greatest nonce seen, kept even
-- when it is closed or expired.
CREATE TABLE am_pins (
    owner      TEXT NOT NULL,
    mailbox_id TEXT NOT NULL,
    nonce      INTEGER NOT NULL,
    card_hash  TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    card       BLOB NOT NULL,
    PRIMARY KEY (owner, mailbox_id)
) STRICT;

-- Every message sent or accepted, as its immutable JCS. Incoming rows are the recipient's
-- durable deduplication by (recipient, sender, message_id) with the content hash; outgoing rows
-- keep the message for retries, re-encryption under a newer card and reply binding.
CREATE TABLE am_messages (
    direction    TEXT NOT NULL CHECK (direction IN ('in', 'out')),
    recipient    TEXT NOT NULL,
    sender       TEXT NOT NULL,
    message_id   TEXT NOT NULL,
    thread_id    TEXT NOT NULL,
    subject      TEXT NOT NULL DEFAULT '',
    in_reply_to  TEXT NOT NULL DEFAULT '',
    content_hash TEXT NOT NULL,
    expires_at   INTEGER NOT NULL,
    mailbox_id   TEXT NOT NULL DEFAULT '',
    message      BLOB NOT NULL,
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (recipient, sender, message_id)
) STRICT;
CREATE INDEX am_messages_by_thread ON am_messages (thread_id);
