//! Attachments (§5.1 non-text parts) as a sender builds them, sans-io: the files a caller hands
//! over decoded, typed by extension when no media type is given, and checked against the seed's
//! limits (at most 32 parts, the media type grammar, names of 1 to 255 scalars) and ours (at most
//! [`MAX_ATTACHMENT_BYTES`] per message, so the sealed packet stays under the 1 MiB packet limit
//! of our cards and relay-lite's). Which received parts count as attachments is [`is_attachment`].

use super::Part;
use super::message::{MAX_NAME_CHARS, MAX_PARTS, is_media_type};

/// Most attachment bytes one message may carry: base64 inside the message and again around the
/// ciphertext make a packet about 16/9 of this, under the 1 MiB (1,048,576-byte) packet limit
/// with room for the text, names and the reply card.
pub const MAX_ATTACHMENT_BYTES: usize = 512 * 1024;
/// Most attachment bytes a profile keeps (received and sent together).
pub const MAX_STORED_BYTES: i64 = 256 * 1024 * 1024;

/// Why files cannot be sent or an attachment cannot be handed out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttachmentError {
    /// More parts than a message may carry (the caller's).
    #[error("a message carries at most {MAX_PARTS} parts (its text counts as one); this one would have {0}")]
    TooManyParts(usize),
    /// The files are bigger than one message may carry (the caller's).
    #[error("attachments total {size} bytes; one message carries at most {MAX_ATTACHMENT_BYTES}")]
    TooLarge {
        /// Their total size.
        size: usize,
    },
    /// A media type outside the grammar (the caller's).
    #[error("attachment {index}: `{media_type}` is not a media type (lower-case type/subtype, no parameters)")]
    MediaType {
        /// Which attachment.
        index: usize,
        /// What was given.
        media_type: String,
    },
    /// A name that is empty or too long (the caller's).
    #[error("attachment {0}: its name must have 1 to {MAX_NAME_CHARS} characters")]
    Name(usize),
    /// Data that is not base64 (the caller's).
    #[error("attachment {0}: data is not base64")]
    Data(usize),
    /// The contact has no Agent Mail channel (the caller's).
    #[error("`{0}` has no Agent Mail channel; only Agent Mail carries files")]
    NotAgentMail(String),
    /// The profile's attachment storage is full (local).
    #[error("the profile keeps at most {MAX_STORED_BYTES} bytes of attachments and has {0}; files cannot be sent")]
    StorageFull(i64),
    /// No such attachment (the caller's).
    #[error("message {id} has no attachment {part}")]
    NoSuchPart {
        /// The message.
        id: String,
        /// The part index asked for.
        part: i64,
    },
    /// The save path is relative (the caller's: the runtime has no working directory of the
    /// user's).
    #[error("save to an absolute path (`switchboard save` makes yours absolute)")]
    RelativePath,
    /// Something is already at the save path (the caller's).
    #[error("{0} already exists; choose another path (nothing is overwritten)")]
    Exists(String),
    /// Writing the file failed (local).
    #[error("could not write {path}: {why}")]
    Write {
        /// Where.
        path: String,
        /// Why.
        why: String,
    },
}

/// A file to send, as a caller hands it over.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AttachmentIn {
    /// Display name (the file's base name); inert.
    pub name: String,
    /// Media type (`application/octet-stream` when not given).
    #[serde(default)]
    pub media_type: Option<String>,
    /// The bytes, base64 (standard or URL-safe, padded or not).
    pub data: String,
}

/// The media type for a file name, from a small table of common extensions;
/// `application/octet-stream` for anything else.
pub fn media_type_for(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "txt" | "log" => "text/plain",
        "md" => "text/markdown",
        "csv" => "text/csv",
        "json" => "application/json",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        "tar" => "application/x-tar",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "html" | "htm" => "text/html",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "wasm" => "application/wasm",
        "mp3" => "audio/mpeg",
        "mp4" => "video/mp4",
        _ => "application/octet-stream",
    }
}

/// Whether `p` is an attachment (kept apart, handed out on request) rather than text shown in
/// the message: anything not `text/*`, and any part that carries a file name.
pub fn is_attachment(p: &Part) -> bool {
    !p.is_text() || p.name.is_some()
}

/// Decodes and checks what a caller asks to send, one error per broken rule.
pub fn decode(files: &[AttachmentIn]) -> std::result::Result<Vec<Part>, AttachmentError> {
    let mut out = Vec::with_capacity(files.len());
    for (i, f) in files.iter().enumerate() {
        let text = f.data.trim_end_matches('=').as_bytes();
        let data = data_encoding::BASE64_NOPAD
            .decode(text)
            .or_else(|_| data_encoding::BASE64URL_NOPAD.decode(text))
            .map_err(|_| AttachmentError::Data(i))?;
        let media_type = f.media_type.clone().unwrap_or_else(|| media_type_for(&f.name).to_owned());
        out.push(Part::bytes(&media_type, data, Some(&f.name)));
    }
    Ok(out)
}

/// Checks the files of one outgoing message (with `text` as its first part unless it is empty).
pub fn check_outgoing(text: &str, files: &[Part]) -> std::result::Result<(), AttachmentError> {
    let parts = files.len() + usize::from(!text.is_empty() || files.is_empty());
    if parts > MAX_PARTS {
        return Err(AttachmentError::TooManyParts(parts));
    }
    for (index, f) in files.iter().enumerate() {
        if !is_media_type(&f.media_type) {
            return Err(AttachmentError::MediaType { index, media_type: f.media_type.clone() });
        }
        if !f.name.as_ref().is_some_and(|n| (1..=MAX_NAME_CHARS).contains(&n.chars().count())) {
            return Err(AttachmentError::Name(index));
        }
    }
    let size = files.iter().map(|f| f.data.len()).sum::<usize>();
    if size > MAX_ATTACHMENT_BYTES {
        return Err(AttachmentError::TooLarge { size });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::agent_identity::AgentId;
    use crate::protocol::agent_mail::card::{CardPayload, MailboxCard};
    use crate::protocol::agent_mail::packet::{SealRequest, seal};
    use crate::protocol::agent_mail::{DAY_MS, Id16, MAX_PACKET_BYTES, Message};
    use crate::util::OsRng;

    fn file(name: &str, size: usize) -> Part {
        Part::bytes("application/octet-stream", vec![7; size], Some(name))
    }

    #[test]
    fn thirty_two_parts_fit_and_thirty_three_do_not() {
        let files: Vec<Part> = (0..31).map(|i| file(&format!("f{i}"), 1)).collect();
        assert_eq!(check_outgoing("text", &files), Ok(()));
        let mut more = files.clone();
        more.push(file("f31", 1));
        assert_eq!(check_outgoing("text", &more), Err(AttachmentError::TooManyParts(33)));
        // Without text, the files alone may be 32.
        assert_eq!(check_outgoing("", &more), Ok(()));
    }

    #[test]
    fn the_size_limit_is_inclusive() {
        assert_eq!(check_outgoing("t", &[file("a", MAX_ATTACHMENT_BYTES)]), Ok(()));
        let over = [file("a", MAX_ATTACHMENT_BYTES / 2), file("b", MAX_ATTACHMENT_BYTES / 2 + 1)];
        assert_eq!(check_outgoing("t", &over), Err(AttachmentError::TooLarge { size: MAX_ATTACHMENT_BYTES + 1 }));
    }

    #[test]
    fn names_have_one_to_255_scalars() {
        assert_eq!(check_outgoing("t", &[file(&"é".repeat(255), 1)]), Ok(()));
        assert_eq!(check_outgoing("t", &[file(&"é".repeat(256), 1)]), Err(AttachmentError::Name(0)));
        assert_eq!(check_outgoing("t", &[file("", 1)]), Err(AttachmentError::Name(0)));
    }

    #[test]
    fn media_types_follow_the_grammar_at_the_length_limit() {
        let ok = format!("a/{}", "b".repeat(125));
        assert_eq!(check_outgoing("t", &[Part::bytes(&ok, vec![], Some("x"))]), Ok(()));
        let long = format!("a/{}", "b".repeat(126));
        assert!(matches!(
            check_outgoing("t", &[Part::bytes(&long, vec![], Some("x"))]),
            Err(AttachmentError::MediaType { index: 0, .. })
        ));
        assert!(matches!(
            check_outgoing("t", &[Part::bytes("Text/HTML; charset=utf-8", vec![], Some("x"))]),
            Err(AttachmentError::MediaType { index: 0, .. })
        ));
    }

    #[test]
    fn media_types_come_from_the_extension() {
        assert_eq!(media_type_for("report.PDF"), "application/pdf");
        assert_eq!(media_type_for("notes.txt"), "text/plain");
        assert_eq!(media_type_for("archive"), "application/octet-stream");
        assert_eq!(media_type_for("x.unknown"), "application/octet-stream");
    }

    #[test]
    fn decoded_files_keep_name_type_and_bytes() {
        let files = [AttachmentIn { name: "a.bin".into(), media_type: None, data: "AAEC_w".into() }];
        let parts = decode(&files).unwrap();
        assert_eq!(parts[0].data, vec![0, 1, 2, 255]);
        assert_eq!(parts[0].media_type, "application/octet-stream");
        assert_eq!(parts[0].name.as_deref(), Some("a.bin"));
        let bad = [AttachmentIn { name: "a".into(), media_type: None, data: "*".into() }];
        assert_eq!(decode(&bad), Err(AttachmentError::Data(0)));
    }

    #[test]
    fn the_largest_message_we_allow_seals_under_the_packet_limit() {
        // 32 parts: a long text and 31 files with the longest names, MAX_ATTACHMENT_BYTES in all.
        let sender = ed25519_dalek::SigningKey::from_bytes(&[1; 32]);
        let owner = ed25519_dalek::SigningKey::from_bytes(&[2; 32]);
        let now = 1_800_000_000_000;
        let public = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from([3; 32])).to_bytes();
        let origin = crate::protocol::agent_identity::Origin::parse("https://relay.example").unwrap();
        let payload = CardPayload {
            mailbox_id: Id16([4; 16]),
            expires_at: now + DAY_MS,
            receive_until: now + 2 * DAY_MS,
            public_key: public,
            routes: vec![origin],
            max_packet_bytes: MAX_PACKET_BYTES,
        };
        let card = MailboxCard::sign(&owner, now, 1, payload).unwrap();
        let reply_payload = CardPayload {
            mailbox_id: Id16([5; 16]),
            expires_at: now + DAY_MS,
            receive_until: now + 2 * DAY_MS,
            public_key: public,
            routes: vec![crate::protocol::agent_identity::Origin::parse("https://relay.example").unwrap()],
            max_packet_bytes: MAX_PACKET_BYTES,
        };
        let reply_card = MailboxCard::sign(&sender, now, 1, reply_payload).unwrap();
        let each = MAX_ATTACHMENT_BYTES / 31;
        let mut files: Vec<Part> = (0..31).map(|i| file(&format!("{i:0>255}"), each)).collect();
        files[0].data.resize(each + MAX_ATTACHMENT_BYTES % 31, 0);
        let text = "x".repeat(4096);
        assert_eq!(check_outgoing(&text, &files), Ok(()));
        let mut parts = vec![Part::text(&text)];
        parts.extend(files);
        let mut m = Message::new(&mut OsRng, AgentId::of(&sender), AgentId::of(&owner), now, now + DAY_MS, parts);
        m.subject = Some("s".repeat(1024));
        m.reply_card = Some(reply_card);
        let packet = seal(
            &SealRequest { sender: &sender, card: &card, message: &m, created_at: now, nonce: 2 },
            now,
            &mut OsRng,
        )
        .unwrap();
        assert!(packet.to_jcs().len() <= MAX_PACKET_BYTES, "{}", packet.to_jcs().len());
    }
}
