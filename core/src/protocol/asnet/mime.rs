//! The trusted MIME adapter: raw RFC 5322 bytes plus the SMTP envelope (MAIL FROM, RCPT TO) from
//! the trusted MTA become the seed's trusted envelope ([`EnvelopeIn`]); and replies become
//! RFC 5322 bytes ([`render_reply`]).
//!
//! Mapping of the seed's provider fields to standard mail:
//! - "SES actual recipient" → the single RCPT TO, which must be the service mailbox (and so must
//!   the single `To:` address: a Bcc'd copy is refused);
//! - "envelope source" → MAIL FROM, which must equal the single parsed `From:` address (an empty
//!   reverse path is a bounce and refused; a `Sender:` naming anyone else is ambiguous);
//! - "spam, virus, DKIM and DMARC verdicts" → the one `Authentication-Results:` header (RFC 8601)
//!   whose authserv-id is the configured one must say `spf=pass`, `dmarc=pass` (exactly one
//!   result each; a `header.from` property must name the From domain) and at least one
//!   `dkim=pass`. Two headers with our authserv-id are refused as ambiguous: the trusted MTA must
//!   strip forged copies (RFC 8601 §5). Spam and virus scanning have no standard header and are
//!   the MTA's job before it hands mail over;
//! - "provider-controlled unique deliveryId" → the queue id (`id` clause) of the topmost
//!   `Received:` header, the one the trusted MTA wrote (configure Postfix with
//!   `enable_long_queue_ids = yes` so ids are not reused within the 24 h dedup horizon).
//!
//! Refused (each a [`Refusal`] variant): over 32 KiB raw or 8 KiB of header section; bare CR or
//! LF, NUL, 8-bit bytes in headers; malformed or folded-first fields; any duplicated field other
//! than the trace and authentication fields that legitimately repeat ([`REPEATABLE`]); `List-*`
//! and `Precedence: list|bulk|junk`; `Reply-To`; `Cc`/`Bcc`; `Resent-*`; `Auto-Submitted` other
//! than `no`; bounces (null MAIL FROM) and DSNs (`multipart/report`, `message/delivery-status`,
//! `X-Failed-Recipients`); multipart (attachments), `Content-Disposition` other than inline,
//! `text/html` and every other type but `text/plain`; charsets other than UTF-8 and US-ASCII;
//! `format=flowed`; transfer encodings other than 7bit, 8bit, quoted-printable and base64; a body
//! that is not valid UTF-8 (or not ASCII when declared so).
//!
//! Hand-written, not `mail-parser`: that crate is deliberately lenient (it recovers from
//! malformed input, keeps one of several duplicated fields, accepts bare LF), and this adapter's
//! job is to refuse exactly those ambiguities. Parsing is linear, bounded by the size checks that
//! come first, and never panics.

use super::Mailbox;
use super::outbox::Entry;
use super::service::EnvelopeIn;

/// Largest raw message.
pub const MAX_RAW_BYTES: usize = 32 * 1024;
/// Largest header section (including its final CRLF).
pub const MAX_HEADER_BYTES: usize = 8 * 1024;
/// Header fields that may appear more than once (trace and authentication fields).
pub const REPEATABLE: [&str; 7] = [
    "received",
    "authentication-results",
    "dkim-signature",
    "arc-seal",
    "arc-message-signature",
    "arc-authentication-results",
    "received-spf",
];

/// What the adapter trusts: the service mailbox and the authserv-id of the trusted MTA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// The service mailbox.
    pub service: Mailbox,
    /// The authserv-id whose `Authentication-Results` are believed.
    pub authserv_id: String,
}

/// The SMTP envelope as the trusted MTA gave it to our listener.
#[derive(Debug, Clone, Copy)]
pub struct SmtpEnvelope<'a> {
    /// The reverse path without angle brackets (empty for the null path `<>`).
    pub mail_from: &'a str,
    /// Every RCPT TO path, without angle brackets.
    pub rcpt_to: &'a [String],
}

/// Why a mail was refused before reaching the protocol core. All are the sender's fault (or the
/// MTA's, for missing trace and authentication headers); none is answered by mail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// More than 32 KiB.
    #[error("message exceeds {MAX_RAW_BYTES} bytes")]
    TooLarge,
    /// Header section over 8 KiB.
    #[error("header section exceeds {MAX_HEADER_BYTES} bytes")]
    HeadersTooLarge,
    /// No empty line ends the header section.
    #[error("no end of header section")]
    NoBody,
    /// A CR or LF that is not part of CRLF.
    #[error("bare CR or LF")]
    BareLineBreak,
    /// A NUL byte anywhere.
    #[error("NUL byte")]
    NulByte,
    /// An 8-bit byte in the header section.
    #[error("non-ASCII header")]
    NonAsciiHeader,
    /// A field without a valid name and colon, or a continuation line with nothing to continue.
    #[error("malformed header field")]
    MalformedHeader,
    /// A non-repeatable field appears twice.
    #[error("duplicate header field")]
    DuplicateHeader,
    /// More or fewer than one RCPT TO.
    #[error("not exactly one envelope recipient")]
    RecipientCount,
    /// RCPT TO is not the service mailbox.
    #[error("envelope recipient is not the service mailbox")]
    WrongRecipient,
    /// Null reverse path: a bounce.
    #[error("bounce (null reverse path)")]
    Bounce,
    /// A delivery status notification.
    #[error("delivery status notification")]
    Dsn,
    /// MAIL FROM is not a bare ASCII mailbox.
    #[error("unusable envelope sender")]
    MailFrom,
    /// No `From:` field.
    #[error("missing From")]
    MissingFrom,
    /// No `To:` field.
    #[error("missing To")]
    MissingTo,
    /// `From:` or `To:` is not exactly one plain mailbox (lists, groups, comments, Unicode).
    #[error("From or To is not exactly one plain mailbox")]
    MalformedAddress,
    /// `To:` is not the service mailbox.
    #[error("To is not the service mailbox")]
    ToNotService,
    /// MAIL FROM differs from `From:`.
    #[error("envelope sender differs from From")]
    SenderMismatch,
    /// `Sender:` names someone other than `From:`.
    #[error("ambiguous sender")]
    AmbiguousSender,
    /// List traffic.
    #[error("list traffic")]
    List,
    /// `Reply-To:` present.
    #[error("Reply-To present")]
    ReplyTo,
    /// `Cc:` or `Bcc:` present.
    #[error("Cc or Bcc present")]
    CcBcc,
    /// `Resent-*` fields (forwarded mail).
    #[error("resent mail")]
    Resent,
    /// `Auto-Submitted` other than `no`.
    #[error("automatic mail")]
    AutoSubmitted,
    /// A multipart message (attachments or alternatives).
    #[error("multipart message")]
    Multipart,
    /// `Content-Disposition` other than inline.
    #[error("attachment")]
    Attachment,
    /// An HTML body.
    #[error("HTML body")]
    Html,
    /// Any type but `text/plain`, or unusable parameters (`format=flowed`).
    #[error("not plain text")]
    NotPlainText,
    /// A charset other than UTF-8 or US-ASCII.
    #[error("unsupported charset")]
    Charset,
    /// A transfer encoding other than 7bit, 8bit, quoted-printable or base64.
    #[error("unsupported transfer encoding")]
    TransferEncoding,
    /// Invalid quoted-printable or base64.
    #[error("invalid body encoding")]
    BodyEncoding,
    /// The decoded body is not text in its charset.
    #[error("body is not text in its charset")]
    BodyNotText,
    /// No `Authentication-Results` from the configured authserv-id.
    #[error("no Authentication-Results from the trusted authserv-id")]
    MissingAuthResults,
    /// More than one `Authentication-Results` from the configured authserv-id.
    #[error("several Authentication-Results from the trusted authserv-id")]
    AmbiguousAuthResults,
    /// Our `Authentication-Results` does not parse.
    #[error("malformed Authentication-Results")]
    MalformedAuthResults,
    /// SPF did not pass.
    #[error("SPF did not pass")]
    SpfFailed,
    /// No DKIM signature passed.
    #[error("DKIM did not pass")]
    DkimFailed,
    /// DMARC did not pass (or passed for another domain).
    #[error("DMARC did not pass")]
    DmarcFailed,
    /// No `Received:` field.
    #[error("missing Received")]
    MissingReceived,
    /// The topmost `Received:` has no `by` host or no usable `id`.
    #[error("topmost Received has no queue id")]
    MalformedReceived,
}

/// One unfolded header field: lower-case name and raw value (CRLFs of folding removed).
struct Field<'a> {
    name: String,
    value: std::borrow::Cow<'a, str>,
}

/// Turns one raw mail and its SMTP envelope into the core's trusted envelope, or refuses it.
pub fn adapt(raw: &[u8], smtp: SmtpEnvelope<'_>, policy: &Policy) -> Result<EnvelopeIn, Refusal> {
    if raw.len() > MAX_RAW_BYTES {
        return Err(Refusal::TooLarge);
    }
    check_line_breaks(raw)?;
    let (head, body) = split_head(raw)?;
    let fields = parse_fields(head)?;

    // Duplicates and forbidden fields.
    for (i, f) in fields.iter().enumerate() {
        if !REPEATABLE.contains(&f.name.as_str()) && fields.iter().skip(i + 1).any(|g| g.name == f.name) {
            return Err(Refusal::DuplicateHeader);
        }
        let name = f.name.as_str();
        if name.starts_with("list-") {
            return Err(Refusal::List);
        }
        if name == "precedence" && matches!(simple_token(&f.value).as_str(), "list" | "bulk" | "junk") {
            return Err(Refusal::List);
        }
        match name {
            "reply-to" => return Err(Refusal::ReplyTo),
            "cc" | "bcc" => return Err(Refusal::CcBcc),
            "x-failed-recipients" => return Err(Refusal::Dsn),
            _ if name.starts_with("resent-") => return Err(Refusal::Resent),
            _ => {}
        }
    }
    let get = |name: &str| fields.iter().find(|f| f.name == name).map(|f| f.value.as_ref());

    // Envelope.
    if smtp.mail_from.is_empty() {
        return Err(Refusal::Bounce);
    }
    let mail_from = Mailbox::parse(smtp.mail_from).map_err(|_| Refusal::MailFrom)?;
    let [rcpt] = smtp.rcpt_to else { return Err(Refusal::RecipientCount) };
    if Mailbox::parse(rcpt).ok().as_ref() != Some(&policy.service) {
        return Err(Refusal::WrongRecipient);
    }

    // Content type before addresses: a DSN is named as one even from a daemon address.
    let (kind, params) = content_type(get("content-type"))?;
    match kind.as_str() {
        "text/plain" => {}
        "multipart/report" | "message/delivery-status" | "message/global-delivery-status" => {
            return Err(Refusal::Dsn);
        }
        "text/html" => return Err(Refusal::Html),
        k if k.starts_with("multipart/") => return Err(Refusal::Multipart),
        _ => return Err(Refusal::NotPlainText),
    }

    // Addresses.
    let from = single_address(get("from").ok_or(Refusal::MissingFrom)?)?;
    let to = single_address(get("to").ok_or(Refusal::MissingTo)?)?;
    if to != policy.service {
        return Err(Refusal::ToNotService);
    }
    if mail_from != from {
        return Err(Refusal::SenderMismatch);
    }
    if let Some(sender) = get("sender")
        && single_address(sender).map_err(|_| Refusal::AmbiguousSender)? != from
    {
        return Err(Refusal::AmbiguousSender);
    }
    let auto_submitted = get("auto-submitted").map(|v| strip_comments(v).trim().to_owned());
    if auto_submitted.as_deref().is_some_and(|v| !v.eq_ignore_ascii_case("no")) {
        return Err(Refusal::AutoSubmitted);
    }

    // Authentication and delivery id.
    check_auth_results(&fields, &policy.authserv_id, from.domain())?;
    let delivery_id = topmost_queue_id(&fields)?;

    // Body.
    if let Some(disposition) = get("content-disposition")
        && simple_token(disposition) != "inline"
    {
        return Err(Refusal::Attachment);
    }
    let mut charset = "us-ascii".to_owned();
    for (name, value) in params {
        match name.as_str() {
            "charset" => charset = value.to_ascii_lowercase(),
            "format" if value.eq_ignore_ascii_case("fixed") => {}
            _ => return Err(Refusal::NotPlainText),
        }
    }
    let decoded = match get("content-transfer-encoding").map(simple_token).as_deref() {
        None | Some("7bit") | Some("8bit") => body.to_vec(),
        Some("quoted-printable") => decode_qp(body)?,
        Some("base64") => decode_base64(body)?,
        Some(_) => return Err(Refusal::TransferEncoding),
    };
    if decoded.contains(&0) {
        return Err(Refusal::NulByte);
    }
    let text = match charset.as_str() {
        "us-ascii" if decoded.is_ascii() => String::from_utf8(decoded).map_err(|_| Refusal::BodyNotText)?,
        "us-ascii" => return Err(Refusal::BodyNotText),
        "utf-8" => String::from_utf8(decoded).map_err(|_| Refusal::BodyNotText)?,
        _ => return Err(Refusal::Charset),
    };

    Ok(EnvelopeIn {
        sender: from.as_str().to_owned(),
        recipient: policy.service.as_str().to_owned(),
        delivery_id,
        auto_submitted,
        body: text,
    })
}

/// Largest reply mail a client reads (a connection list may be longer than a command).
pub const MAX_REPLY_RAW_BYTES: usize = 256 * 1024;

/// What a client needs from a mail in its own mailbox that claims to be a service reply: the
/// single `From:` address, `X-ASNET-Response-ID`, `Auto-Submitted` and the decoded text body.
/// The header rules are the inbound ones (no duplicated `From`/`X-ASNET-Response-ID`, plain
/// text only); whether `from` is the service is the caller's check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyParts {
    /// The one `From:` mailbox.
    pub from: Mailbox,
    /// `X-ASNET-Response-ID`, when present.
    pub response_id: Option<String>,
    /// `Auto-Submitted`, when present.
    pub auto_submitted: Option<String>,
    /// The decoded body.
    pub body: String,
}

/// Splits a reply mail into [`ReplyParts`], or refuses it.
pub fn reply_parts(raw: &[u8]) -> Result<ReplyParts, Refusal> {
    if raw.len() > MAX_REPLY_RAW_BYTES {
        return Err(Refusal::TooLarge);
    }
    check_line_breaks(raw)?;
    let (head, body) = split_head(raw)?;
    let fields = parse_fields(head)?;
    for (i, f) in fields.iter().enumerate() {
        if !REPEATABLE.contains(&f.name.as_str())
            && f.name != "delivered-to"
            && fields.iter().skip(i + 1).any(|g| g.name == f.name)
        {
            return Err(Refusal::DuplicateHeader);
        }
    }
    let get = |name: &str| fields.iter().find(|f| f.name == name).map(|f| f.value.as_ref());
    let (kind, params) = content_type(get("content-type"))?;
    if kind != "text/plain" {
        return Err(Refusal::NotPlainText);
    }
    let from = single_address(get("from").ok_or(Refusal::MissingFrom)?)?;
    let decoded = match get("content-transfer-encoding").map(simple_token).as_deref() {
        None | Some("7bit") | Some("8bit") => body.to_vec(),
        Some("quoted-printable") => decode_qp(body)?,
        Some("base64") => decode_base64(body)?,
        Some(_) => return Err(Refusal::TransferEncoding),
    };
    let charset = params.iter().find(|(n, _)| n == "charset").map(|(_, v)| v.to_ascii_lowercase());
    if !matches!(charset.as_deref(), None | Some("us-ascii") | Some("utf-8")) {
        return Err(Refusal::Charset);
    }
    let body = String::from_utf8(decoded).map_err(|_| Refusal::BodyNotText)?;
    Ok(ReplyParts {
        from,
        response_id: get("x-asnet-response-id").map(|v| v.trim().to_owned()),
        auto_submitted: get("auto-submitted").map(|v| strip_comments(v).trim().to_owned()),
        body,
    })
}

/// Every CR must start a CRLF and every LF end one.
fn check_line_breaks(raw: &[u8]) -> Result<(), Refusal> {
    let mut prev = 0u8;
    for (i, &b) in raw.iter().enumerate() {
        match b {
            b'\r' if raw.get(i + 1) != Some(&b'\n') => return Err(Refusal::BareLineBreak),
            b'\n' if prev != b'\r' => return Err(Refusal::BareLineBreak),
            0 => return Err(Refusal::NulByte),
            _ => {}
        }
        prev = b;
    }
    Ok(())
}

/// Splits at the first empty line: the header section keeps its last CRLF.
fn split_head(raw: &[u8]) -> Result<(&str, &[u8]), Refusal> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 2);
    let end = match end {
        // A message that starts with the empty line has no header fields at all.
        _ if raw.starts_with(b"\r\n") => 0,
        Some(e) => e,
        None if raw.len() > MAX_HEADER_BYTES => return Err(Refusal::HeadersTooLarge),
        None => return Err(Refusal::NoBody),
    };
    if end > MAX_HEADER_BYTES {
        return Err(Refusal::HeadersTooLarge);
    }
    let head = raw.get(..end).ok_or(Refusal::NoBody)?;
    let body = raw.get(end + 2..).ok_or(Refusal::NoBody)?;
    if !head.is_ascii() {
        return Err(Refusal::NonAsciiHeader);
    }
    let head = std::str::from_utf8(head).map_err(|_| Refusal::NonAsciiHeader)?;
    Ok((head, body))
}

/// Unfolds and splits the header section into fields.
fn parse_fields(head: &str) -> Result<Vec<Field<'_>>, Refusal> {
    let mut fields: Vec<Field<'_>> = Vec::new();
    for line in head.split_terminator("\r\n") {
        if line.starts_with([' ', '\t']) {
            let last = fields.last_mut().ok_or(Refusal::MalformedHeader)?;
            if line.trim().is_empty() {
                // A whitespace-only continuation line is obsolete syntax.
                return Err(Refusal::MalformedHeader);
            }
            last.value.to_mut().push_str(line);
            continue;
        }
        let (name, value) = line.split_once(':').ok_or(Refusal::MalformedHeader)?;
        if name.is_empty() || !name.bytes().all(|b| (33..=126).contains(&b)) {
            return Err(Refusal::MalformedHeader);
        }
        fields.push(Field { name: name.to_ascii_lowercase(), value: std::borrow::Cow::Borrowed(value) });
    }
    Ok(fields)
}

/// Removes RFC 5322 comments (nested, with quoted-pairs) outside quoted strings.
fn strip_comments(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let mut depth = 0usize;
    let mut quoted = false;
    let mut escaped = false;
    for c in value.chars() {
        if escaped {
            escaped = false;
            if depth == 0 {
                out.push(c);
            }
            continue;
        }
        match c {
            '\\' if quoted || depth > 0 => {
                escaped = true;
                if depth == 0 {
                    out.push(c);
                }
            }
            '"' if depth == 0 => {
                quoted = !quoted;
                out.push(c);
            }
            '(' if !quoted => {
                depth += 1;
                if depth == 1 {
                    out.push(' ');
                }
            }
            ')' if !quoted && depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// The first `;`-separated part of a value, comments removed, trimmed and lower-cased.
fn simple_token(value: &str) -> String {
    let v = strip_comments(value);
    v.split(';').next().unwrap_or_default().trim().to_ascii_lowercase()
}

/// `type/subtype` (lower case) and its parameters (lower-case names, unquoted values).
/// No `Content-Type` means `text/plain; charset=us-ascii`.
fn content_type(value: Option<&str>) -> Result<(String, Vec<(String, String)>), Refusal> {
    let Some(value) = value else { return Ok(("text/plain".into(), Vec::new())) };
    let v = strip_comments(value);
    let mut parts = split_outside_quotes(&v, ';').into_iter();
    let kind = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
    let mut params = Vec::new();
    for part in parts {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (name, val) = part.split_once('=').ok_or(Refusal::NotPlainText)?;
        let val = val.trim();
        let val = match val.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
            Some(inner) => inner.replace("\\\"", "\"").replace("\\\\", "\\"),
            None => val.to_owned(),
        };
        let name = name.trim().to_ascii_lowercase();
        if params.iter().any(|(n, _)| *n == name) {
            return Err(Refusal::NotPlainText);
        }
        params.push((name, val));
    }
    Ok((kind, params))
}

/// Splits on `sep` outside double-quoted strings.
fn split_outside_quotes(value: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut quoted = false;
    let mut escaped = false;
    let mut start = 0;
    for (i, c) in value.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            c if c == sep && !quoted => {
                parts.push(value.get(start..i).unwrap_or_default());
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(value.get(start..).unwrap_or_default());
    parts
}

/// Exactly one plain mailbox: `addr`, `Name <addr>` or `"Name" <addr>`. The display name is
/// ignored but must not hide specials; comments, groups and lists are refused.
fn single_address(value: &str) -> Result<Mailbox, Refusal> {
    let v = value.trim();
    // A quoted display name may itself contain `<`: look for the address after it.
    let lt = match v.strip_prefix('"') {
        Some(inner) => closing_quote(inner).map(|q| q + 1).and_then(|end| v.get(end..)?.find('<').map(|i| i + end)),
        None => v.find('<'),
    };
    let addr = match lt {
        None => {
            if v.contains(|c: char| c.is_ascii_whitespace() || "\",;:()<>[]\\".contains(c)) {
                return Err(Refusal::MalformedAddress);
            }
            v
        }
        Some(lt) => {
            let display = v.get(..lt).unwrap_or_default().trim();
            let rest = v.get(lt + 1..).unwrap_or_default();
            let inner = rest.strip_suffix('>').ok_or(Refusal::MalformedAddress)?;
            if inner.contains(['<', '>']) || inner.contains(|c: char| c.is_ascii_whitespace()) {
                return Err(Refusal::MalformedAddress);
            }
            if !display_name_ok(display) {
                return Err(Refusal::MalformedAddress);
            }
            inner
        }
    };
    Mailbox::parse(addr).map_err(|_| Refusal::MalformedAddress)
}

/// The byte index of the unescaped `"` that closes a quoted string whose opening quote has
/// been stripped.
fn closing_quote(inner: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in inner.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '"' => return Some(i),
            _ => {}
        }
    }
    None
}

/// An empty display name, one quoted string, or a phrase without specials.
fn display_name_ok(display: &str) -> bool {
    if display.is_empty() {
        return true;
    }
    if let Some(inner) = display.strip_prefix('"') {
        return closing_quote(inner).is_some_and(|q| q + 1 == inner.len());
    }
    !display.contains(|c: char| "\"(),:;<>@[]\\".contains(c))
}

/// Finds our one `Authentication-Results` and checks SPF, DKIM and DMARC.
fn check_auth_results(fields: &[Field<'_>], authserv_id: &str, from_domain: &str) -> Result<(), Refusal> {
    let mut ours = None;
    for f in fields.iter().filter(|f| f.name == "authentication-results") {
        let text = strip_comments(&f.value);
        let mut segments = split_outside_quotes(&text, ';').into_iter();
        let head = words(segments.next().unwrap_or_default());
        let Some(id) = head.first() else { continue };
        if !unquote(id).eq_ignore_ascii_case(authserv_id) {
            continue;
        }
        if ours.is_some() {
            return Err(Refusal::AmbiguousAuthResults);
        }
        if head.len() > 2 || head.get(1).is_some_and(|v| !v.bytes().all(|b| b.is_ascii_digit())) {
            return Err(Refusal::MalformedAuthResults);
        }
        let results: Vec<Vec<String>> = segments.map(words).collect();
        ours = Some(results);
    }
    let results = ours.ok_or(Refusal::MissingAuthResults)?;
    let (mut spf, mut dkim_pass, mut dmarc) = (Vec::new(), false, Vec::new());
    for r in &results {
        // `method[/version]=result`, then `reason=…` and `ptype.property=value` words.
        let Some((first, props)) = r.split_first() else { return Err(Refusal::MalformedAuthResults) };
        if first.eq_ignore_ascii_case("none") && props.is_empty() {
            continue;
        }
        let (method, result) = first.split_once('=').ok_or(Refusal::MalformedAuthResults)?;
        let method = method.split_once('/').map_or(method, |(m, _)| m).trim();
        let result = result.to_ascii_lowercase();
        let mut pairs = Vec::with_capacity(props.len());
        for p in props {
            pairs.push(p.split_once('=').ok_or(Refusal::MalformedAuthResults)?);
        }
        let prop = |key: &str| pairs.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| *v);
        match method.to_ascii_lowercase().as_str() {
            "spf" => spf.push(result),
            "dkim" => dkim_pass |= result == "pass",
            "dmarc" => {
                let aligned = prop("header.from").is_none_or(|d| unquote(d).eq_ignore_ascii_case(from_domain));
                dmarc.push((result, aligned));
            }
            _ => {}
        }
    }
    if spf.as_slice() != ["pass"] {
        return Err(Refusal::SpfFailed);
    }
    if !dkim_pass {
        return Err(Refusal::DkimFailed);
    }
    match dmarc.as_slice() {
        [(result, true)] if result == "pass" => Ok(()),
        _ => Err(Refusal::DmarcFailed),
    }
}

/// Splits a comment-free value into words at whitespace outside quoted strings, first closing
/// up whitespace around `=` (RFC 8601 allows CFWS there).
fn words(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut escaped = false;
    for c in text.chars() {
        if quoted {
            cur.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                quoted = false;
            }
            continue;
        }
        match c {
            // Whitespace after `=` does not end the word.
            c if c.is_ascii_whitespace() => {
                if !cur.is_empty() && !cur.ends_with('=') {
                    out.push(std::mem::take(&mut cur));
                }
            }
            '=' => {
                // `a = b` → `a=b`: glue to the previous word when there is no current one.
                if cur.is_empty()
                    && let Some(prev) = out.pop()
                {
                    cur = prev;
                }
                cur.push('=');
            }
            '"' => {
                quoted = true;
                cur.push(c);
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The content of a quoted string, or the word itself.
fn unquote(word: &str) -> String {
    match word.strip_prefix('"').and_then(|w| w.strip_suffix('"')) {
        Some(inner) => inner.replace("\\\"", "\"").replace("\\\\", "\\"),
        None => word.to_owned(),
    }
}

/// The queue id of the topmost `Received:` field, which the trusted MTA wrote.
fn topmost_queue_id(fields: &[Field<'_>]) -> Result<String, Refusal> {
    let received = fields.iter().find(|f| f.name == "received").ok_or(Refusal::MissingReceived)?;
    let text = strip_comments(&received.value);
    // Clauses end at the `;` before the date.
    let clauses = text.rsplit_once(';').map_or(text.as_str(), |(c, _)| c);
    let words: Vec<&str> = clauses.split_ascii_whitespace().collect();
    let after =
        |kw: &str| words.iter().position(|w| w.eq_ignore_ascii_case(kw)).and_then(|i| words.get(i + 1)).copied();
    if after("by").is_none() {
        return Err(Refusal::MalformedReceived);
    }
    let id = after("id").ok_or(Refusal::MalformedReceived)?;
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
        return Err(Refusal::MalformedReceived);
    }
    Ok(id.to_owned())
}

/// Strict quoted-printable (RFC 2045 §6.7): soft breaks, `=XX` escapes, trailing whitespace on
/// a line dropped, 8-bit bytes refused.
fn decode_qp(body: &[u8]) -> Result<Vec<u8>, Refusal> {
    let mut out = Vec::with_capacity(body.len());
    let mut lines = body.split(|b| *b == b'\n').peekable();
    while let Some(line) = lines.next() {
        let last = lines.peek().is_none();
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let line = line.trim_ascii_end();
        let (line, soft) = match line.strip_suffix(b"=") {
            Some(l) => (l, true),
            None => (line, false),
        };
        let mut i = 0;
        while let Some(&b) = line.get(i) {
            if b == b'=' {
                let hex = line.get(i + 1..i + 3).ok_or(Refusal::BodyEncoding)?;
                let text = std::str::from_utf8(hex).map_err(|_| Refusal::BodyEncoding)?;
                if !text.bytes().all(|c| c.is_ascii_hexdigit()) {
                    return Err(Refusal::BodyEncoding);
                }
                out.push(u8::from_str_radix(text, 16).map_err(|_| Refusal::BodyEncoding)?);
                i += 3;
            } else if b == b'\t' || (b' '..=b'~').contains(&b) {
                out.push(b);
                i += 1;
            } else {
                return Err(Refusal::BodyEncoding);
            }
        }
        if !soft && !last {
            out.extend_from_slice(b"\r\n");
        }
    }
    Ok(out)
}

/// Strict base64 in CRLF-separated lines (padding required, no other whitespace).
fn decode_base64(body: &[u8]) -> Result<Vec<u8>, Refusal> {
    let joined: Vec<u8> =
        body.split(|b| *b == b'\n').flat_map(|l| l.strip_suffix(b"\r").unwrap_or(l)).copied().collect();
    data_encoding::BASE64.decode(&joined).map_err(|_| Refusal::BodyEncoding)
}

/// Renders a queued reply as an RFC 5322 message from the service mailbox: plain ASCII text,
/// `Auto-Submitted: auto-generated` and the stable `X-ASNET-Response-ID` (also the Message-ID's
/// local part, so a resend is recognisably the same message).
pub fn render_reply(entry: &Entry, service: &Mailbox, now_ms: i64) -> Vec<u8> {
    let mut out = String::with_capacity(entry.body.len() + 512);
    let rid = entry.response_id.to_string();
    let subject = format!("ASNET/1 {}", entry.kind);
    let date = rfc5322_date(now_ms);
    let message_id = format!("<{rid}@{}>", service.domain());
    for (name, value) in [
        ("From", service.as_str()),
        ("To", entry.to.as_str()),
        ("Subject", subject.as_str()),
        ("Date", date.as_str()),
        ("Message-ID", message_id.as_str()),
        ("Auto-Submitted", "auto-generated"),
        ("X-ASNET-Response-ID", rid.as_str()),
        ("MIME-Version", "1.0"),
        ("Content-Type", "text/plain; charset=us-ascii"),
        ("Content-Transfer-Encoding", "7bit"),
    ] {
        out.push_str(name);
        out.push_str(": ");
        out.push_str(value);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    for line in entry.body.lines() {
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.into_bytes()
}

/// `Tue, 01 Dec 2026 20:04:43 +0000` for a Unix time in ms (UTC).
pub fn rfc5322_date(now_ms: i64) -> String {
    let secs = now_ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    const WEEKDAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let weekday = usize::try_from(days.rem_euclid(7)).ok().and_then(|i| WEEKDAYS.get(i)).copied().unwrap_or("Thu");
    let month_name = usize::try_from(month - 1).ok().and_then(|i| MONTHS.get(i)).copied().unwrap_or("Jan");
    format!(
        "{weekday}, {day:02} {month_name} {year:04} {:02}:{:02}:{:02} +0000",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}
