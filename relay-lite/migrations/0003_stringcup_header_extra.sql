-- Stringcup v2: extra message header fields. The reference client puts fields of its own in a
-- message's header (its pairing verification sends `purpose` and `tag`) and expects the relay
-- to hand them to the recipient unchanged. The route bounds them (at most 16 string fields,
-- 4 KiB encoded) and stores them here as one JSON object of strings; '' means none. Their
-- length counts towards the pending byte limits along with the ciphertext (`size`).
ALTER TABLE sc_message ADD COLUMN header_extra TEXT NOT NULL DEFAULT '';
