//! The SMTP server the trusted MTA hands ASNET mail to: the RFC 5321 subset an MTA's SMTP or LMTP
//! client uses, nothing more.
//!
//! - [`parse_command`] turns one command line into a [`Command`] (sans-io; fuzzed);
//! - [`Session`] is the transaction state machine: greeting, `EHLO`/`HELO`, `MAIL FROM`,
//!   `RCPT TO` (only the service mailbox, one per transaction), `DATA`, `RSET`, `NOOP`, `QUIT`;
//! - [`DataBody`] collects the message while it is read: dot-unstuffing, the end marker, and the
//!   32 KiB raw limit enforced as the bytes arrive (a bigger message is read to its end and
//!   discarded, never buffered);
//! - [`serve_connection`] drives one TCP connection with bounded lines and timeouts.
//!
//! Not offered: AUTH, STARTTLS, SMTPUTF8, BDAT/CHUNKING, VRFY/EXPN. The listener accepts only
//! loopback and configured peers (the trusted MTA), so it is not an internet-facing MX.

use std::fmt::Write as _;
use std::time::Duration;

use switchboard_core::protocol::asnet::Mailbox;
use switchboard_core::protocol::asnet::mime::MAX_RAW_BYTES;
use tokio::io::{AsyncBufRead, AsyncBufReadExt as _, AsyncRead, AsyncWrite, AsyncWriteExt as _, BufReader};

/// Longest command line, CRLF included (RFC 5321 §4.5.3.1.4).
pub const MAX_COMMAND_LINE: usize = 512;
/// Longest text line inside DATA, CRLF included (RFC 5321 §4.5.3.1.6).
pub const MAX_TEXT_LINE: usize = 1000;
/// Longest path inside angle brackets (RFC 5321 §4.5.3.1.3).
pub const MAX_PATH: usize = 256;
/// Commands refused in a row before the connection is closed.
pub const MAX_ERRORS: u32 = 10;

/// One parsed SMTP command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `EHLO domain`.
    Ehlo(String),
    /// `HELO domain`.
    Helo(String),
    /// `MAIL FROM:<path>` with an optional `SIZE=` declaration; the path is empty for `<>`.
    Mail {
        /// The reverse path without brackets.
        path: String,
        /// The declared size, if any.
        size: Option<u64>,
    },
    /// `RCPT TO:<path>`.
    Rcpt(String),
    /// `DATA`.
    Data,
    /// `RSET`.
    Rset,
    /// `NOOP [string]`.
    Noop,
    /// `QUIT`.
    Quit,
}

/// Why a command line was refused; each maps to one reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Unknown or unimplemented verb (`500`/`502`).
    #[error("command not recognized")]
    Unrecognized,
    /// A known verb with bad arguments (`501`).
    #[error("syntax error in parameters")]
    Syntax,
    /// A `MAIL`/`RCPT` parameter this server does not offer (`555`).
    #[error("parameter not recognized")]
    Parameter,
    /// Not ASCII (`500`).
    #[error("non-ASCII command")]
    NonAscii,
}

impl ParseError {
    /// The reply for this refusal.
    pub fn reply(self) -> Reply {
        match self {
            ParseError::Unrecognized => Reply::new(502, "5.5.1 Command not implemented"),
            ParseError::Syntax => Reply::new(501, "5.5.4 Syntax error in parameters"),
            ParseError::Parameter => Reply::new(555, "5.5.4 Parameter not recognized"),
            ParseError::NonAscii => Reply::new(500, "5.5.2 Non-ASCII command"),
        }
    }
}

/// Parses one command line (without its CRLF). Verbs are case-insensitive.
pub fn parse_command(line: &[u8]) -> Result<Command, ParseError> {
    if !line.is_ascii() || line.iter().any(|b| b.is_ascii_control() && *b != b'\t') {
        return Err(ParseError::NonAscii);
    }
    let line = std::str::from_utf8(line).map_err(|_| ParseError::NonAscii)?;
    let (verb, rest) = match line.split_once(' ') {
        Some((v, r)) => (v, r),
        None => (line, ""),
    };
    let no_args = |c: Command| if rest.trim().is_empty() { Ok(c) } else { Err(ParseError::Syntax) };
    match verb.to_ascii_uppercase().as_str() {
        "EHLO" => Ok(Command::Ehlo(domain_arg(rest)?)),
        "HELO" => Ok(Command::Helo(domain_arg(rest)?)),
        "MAIL" => {
            let (path, params) = path_arg(rest, "FROM:")?;
            let mut size = None;
            for param in params {
                let (key, value) = param.split_once('=').unwrap_or((param, ""));
                match key.to_ascii_uppercase().as_str() {
                    "SIZE" if size.is_none() => {
                        if value.is_empty() || value.len() > 20 || !value.bytes().all(|b| b.is_ascii_digit()) {
                            return Err(ParseError::Syntax);
                        }
                        size = Some(value.parse().map_err(|_| ParseError::Syntax)?);
                    }
                    "BODY" if value.eq_ignore_ascii_case("7BIT") || value.eq_ignore_ascii_case("8BITMIME") => {}
                    _ => return Err(ParseError::Parameter),
                }
            }
            Ok(Command::Mail { path, size })
        }
        "RCPT" => {
            let (path, mut params) = path_arg(rest, "TO:")?;
            if params.next().is_some() {
                return Err(ParseError::Parameter);
            }
            if path.is_empty() {
                return Err(ParseError::Syntax);
            }
            Ok(Command::Rcpt(path))
        }
        "DATA" => no_args(Command::Data),
        "RSET" => no_args(Command::Rset),
        "QUIT" => no_args(Command::Quit),
        "NOOP" => Ok(Command::Noop),
        _ => Err(ParseError::Unrecognized),
    }
}

/// The domain (or address literal) argument of `EHLO`/`HELO`.
fn domain_arg(rest: &str) -> Result<String, ParseError> {
    let arg = rest.trim();
    if arg.is_empty() || arg.len() > 255 || arg.contains(' ') || arg.contains('\t') {
        return Err(ParseError::Syntax);
    }
    Ok(arg.to_owned())
}

/// `FROM:<path> params` or `TO:<path> params`: the path without brackets and the parameters.
fn path_arg<'a>(rest: &'a str, keyword: &str) -> Result<(String, std::str::SplitAsciiWhitespace<'a>), ParseError> {
    let head = rest.get(..keyword.len()).ok_or(ParseError::Syntax)?;
    if !head.eq_ignore_ascii_case(keyword) {
        return Err(ParseError::Syntax);
    }
    let after = rest.get(keyword.len()..).ok_or(ParseError::Syntax)?;
    // Some clients put a space after the colon; tolerate exactly that.
    let after = after.strip_prefix(' ').unwrap_or(after);
    let inner = after.strip_prefix('<').ok_or(ParseError::Syntax)?;
    let close = inner.find('>').ok_or(ParseError::Syntax)?;
    let path = inner.get(..close).ok_or(ParseError::Syntax)?;
    let params = inner.get(close + 1..).ok_or(ParseError::Syntax)?;
    if !(params.is_empty() || params.starts_with(' ')) {
        return Err(ParseError::Syntax);
    }
    // Source routes (`@a,@b:x@y`) are obsolete; quoted local parts are refused by the adapter.
    if path.len() > MAX_PATH || path.starts_with('@') || path.contains(['<', ' ', '\t']) {
        return Err(ParseError::Syntax);
    }
    Ok((path.to_owned(), params.split_ascii_whitespace()))
}

/// An SMTP reply: a code and one or more text lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The three-digit code.
    pub code: u16,
    /// The text lines (at least one).
    pub lines: Vec<String>,
}

impl Reply {
    /// A one-line reply.
    pub fn new(code: u16, text: impl Into<String>) -> Self {
        Self { code, lines: vec![text.into()] }
    }

    /// The wire form, `code-text` lines and a final `code text`, each ending in CRLF.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let last = self.lines.len().saturating_sub(1);
        for (i, line) in self.lines.iter().enumerate() {
            let sep = if i == last { ' ' } else { '-' };
            let _ = write!(out, "{}{sep}{line}\r\n", self.code);
        }
        if self.lines.is_empty() {
            let _ = write!(out, "{} \r\n", self.code);
        }
        out
    }

    /// Whether the code is a positive completion (2xx).
    pub fn is_ok(&self) -> bool {
        (200..300).contains(&self.code)
    }
}

/// What the driver must do after a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Send this reply and read the next command.
    Reply(Reply),
    /// Send `354` and read the message.
    StartData(Reply),
    /// Send this reply and close.
    Close(Reply),
}

/// Where a transaction is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// No `EHLO`/`HELO` yet.
    Fresh,
    /// Greeted; no transaction.
    Ready,
    /// `MAIL` given.
    Mail { from: String },
    /// At least one `RCPT` accepted.
    Rcpt { from: String, to: String },
}

/// The transaction state machine of one connection (sans-io).
#[derive(Debug)]
pub struct Session {
    service: Mailbox,
    hostname: String,
    state: State,
    errors: u32,
}

impl Session {
    /// A session for a server named `hostname` that delivers only to `service`.
    pub fn new(service: Mailbox, hostname: impl Into<String>) -> Self {
        Self { service, hostname: hostname.into(), state: State::Fresh, errors: 0 }
    }

    /// The `220` greeting.
    pub fn greeting(&self) -> Reply {
        Reply::new(220, format!("{} ESMTP relay-lite ASNET/1", self.hostname))
    }

    /// The reply to a line longer than [`MAX_COMMAND_LINE`].
    pub fn line_too_long(&mut self) -> Step {
        self.refuse(Reply::new(500, "5.5.6 Line too long"))
    }

    fn refuse(&mut self, reply: Reply) -> Step {
        self.errors += 1;
        if self.errors >= MAX_ERRORS {
            return Step::Close(Reply::new(421, "4.7.0 Too many errors, closing"));
        }
        Step::Reply(reply)
    }

    /// Handles one parsed (or refused) command line.
    pub fn command(&mut self, command: Result<Command, ParseError>) -> Step {
        let command = match command {
            Ok(c) => c,
            Err(e) => return self.refuse(e.reply()),
        };
        let step = match (command, &self.state) {
            (Command::Quit, _) => return Step::Close(Reply::new(221, "2.0.0 Bye")),
            (Command::Noop, _) => Step::Reply(Reply::new(250, "2.0.0 Ok")),
            (Command::Rset, _) => {
                if self.state != State::Fresh {
                    self.state = State::Ready;
                }
                Step::Reply(Reply::new(250, "2.0.0 Ok"))
            }
            (Command::Ehlo(_), _) => {
                self.state = State::Ready;
                Step::Reply(Reply {
                    code: 250,
                    lines: vec![
                        self.hostname.clone(),
                        "PIPELINING".into(),
                        format!("SIZE {MAX_RAW_BYTES}"),
                        "8BITMIME".into(),
                        "ENHANCEDSTATUSCODES".into(),
                    ],
                })
            }
            (Command::Helo(_), _) => {
                self.state = State::Ready;
                Step::Reply(Reply::new(250, self.hostname.clone()))
            }
            (Command::Mail { .. }, State::Fresh) => return self.refuse(Reply::new(503, "5.5.1 EHLO first")),
            (Command::Mail { path, size }, State::Ready) => {
                if size.is_some_and(|s| s > MAX_RAW_BYTES as u64) {
                    return self.refuse(Reply::new(552, "5.3.4 Message too big"));
                }
                self.state = State::Mail { from: path };
                Step::Reply(Reply::new(250, "2.1.0 Ok"))
            }
            (Command::Mail { .. }, _) => return self.refuse(Reply::new(503, "5.5.1 Nested MAIL")),
            (Command::Rcpt(_), State::Fresh | State::Ready) => {
                return self.refuse(Reply::new(503, "5.5.1 MAIL first"));
            }
            (Command::Rcpt(path), State::Mail { from }) => {
                if Mailbox::parse(&path).ok().as_ref() != Some(&self.service) {
                    return self.refuse(Reply::new(550, "5.1.1 No such mailbox here"));
                }
                self.state = State::Rcpt { from: from.clone(), to: path };
                Step::Reply(Reply::new(250, "2.1.5 Ok"))
            }
            // One recipient per transaction: the MTA retries the rest in another one.
            (Command::Rcpt(_), State::Rcpt { .. }) => Step::Reply(Reply::new(452, "4.5.3 One recipient per message")),
            (Command::Data, State::Rcpt { .. }) => Step::StartData(Reply::new(354, "End data with <CR><LF>.<CR><LF>")),
            (Command::Data, _) => return self.refuse(Reply::new(503, "5.5.1 RCPT first")),
        };
        self.errors = 0;
        step
    }

    /// After the message was read: the envelope of the transaction, which ends (state back to
    /// greeted). `None` outside a transaction with a recipient.
    pub fn finish_data(&mut self) -> Option<(String, String)> {
        match std::mem::replace(&mut self.state, State::Ready) {
            State::Rcpt { from, to } => Some((from, to)),
            other => {
                self.state = other;
                None
            }
        }
    }
}

/// The message body being read after `354`: unstuffed lines up to the raw limit.
#[derive(Debug)]
pub struct DataBody {
    raw: Vec<u8>,
    limit: usize,
    too_big: bool,
    line_too_long: bool,
}

/// What the last line did to a [`DataBody`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataLine {
    /// More lines follow.
    More,
    /// The end marker: the message is complete.
    End,
}

impl DataBody {
    /// An empty body with the raw limit `limit`.
    pub fn new(limit: usize) -> Self {
        Self { raw: Vec::new(), limit, too_big: false, line_too_long: false }
    }

    /// Takes one line as read, terminator included (a line cut at [`MAX_TEXT_LINE`] arrives in
    /// pieces; [`DataBody::mark_line_too_long`] records that).
    pub fn push_line(&mut self, line: &[u8]) -> DataLine {
        if line == b".\r\n" {
            return DataLine::End;
        }
        // RFC 5321 §4.5.2: a leading dot was doubled by the client.
        let line = line.strip_prefix(b".").unwrap_or(line);
        if self.too_big || self.raw.len() + line.len() > self.limit {
            self.too_big = true;
            self.raw = Vec::new();
        } else {
            self.raw.extend_from_slice(line);
        }
        DataLine::More
    }

    /// Records that a text line exceeded [`MAX_TEXT_LINE`].
    pub fn mark_line_too_long(&mut self) {
        self.line_too_long = true;
    }

    /// The message, or the reply refusing it.
    pub fn finish(self) -> Result<Vec<u8>, Reply> {
        if self.too_big {
            return Err(Reply::new(552, "5.3.4 Message too big"));
        }
        if self.line_too_long {
            return Err(Reply::new(500, "5.5.6 Line too long"));
        }
        Ok(self.raw)
    }
}

/// How long the server waits (RFC 5321 §4.5.3.2 gives 5 and 10 minutes; a trusted MTA on the
/// same host is faster).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// For each command line.
    pub command: Duration,
    /// For the whole message after `354`.
    pub data: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self { command: Duration::from_secs(300), data: Duration::from_secs(600) }
    }
}

/// One line read with a bound.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// A line, terminator included (the last one may lack it at end of stream).
    Full,
    /// The line was longer than the bound: this is a piece of it (no terminator yet).
    Piece,
    /// End of stream with nothing read.
    Eof,
}

/// Reads up to and including `\n`, at most `max` bytes, into `buf` (cleared first).
async fn read_line_bounded<R: AsyncBufRead + Unpin>(r: &mut R, max: usize, buf: &mut Vec<u8>) -> std::io::Result<Line> {
    buf.clear();
    loop {
        let available = r.fill_buf().await?;
        if available.is_empty() {
            return Ok(if buf.is_empty() { Line::Eof } else { Line::Full });
        }
        let room = max.saturating_sub(buf.len());
        let window = available.get(..room.min(available.len())).unwrap_or_default();
        if let Some(pos) = window.iter().position(|b| *b == b'\n') {
            buf.extend_from_slice(window.get(..=pos).unwrap_or_default());
            r.consume(pos + 1);
            return Ok(Line::Full);
        }
        let n = window.len();
        buf.extend_from_slice(window);
        r.consume(n);
        if buf.len() >= max {
            return Ok(Line::Piece);
        }
    }
}

/// Strips one trailing CRLF (or bare LF) from a command line.
fn trim_eol(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Receives complete messages from [`serve_connection`].
pub trait Deliver {
    /// Handles one message with its envelope; the reply is sent to the client (a `2xx` only once
    /// the message is durably handled).
    fn deliver(
        &self,
        mail_from: String,
        rcpt_to: String,
        raw: Vec<u8>,
    ) -> impl std::future::Future<Output = Reply> + Send;
}

/// Serves one connection until `QUIT`, an error limit, a timeout or end of stream.
pub async fn serve_connection<S, D>(
    stream: S,
    mut session: Session,
    timeouts: Timeouts,
    deliver: &D,
) -> std::io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
    D: Deliver + Sync,
{
    let (read, mut write) = tokio::io::split(stream);
    let mut read = BufReader::with_capacity(4096, read);
    let mut line = Vec::with_capacity(MAX_COMMAND_LINE);
    write.write_all(session.greeting().render().as_bytes()).await?;
    let timeout_reply = Reply::new(421, "4.4.2 Timeout, closing");
    loop {
        let got =
            match tokio::time::timeout(timeouts.command, read_line_bounded(&mut read, MAX_COMMAND_LINE, &mut line))
                .await
            {
                Ok(got) => got?,
                Err(_) => {
                    write.write_all(timeout_reply.render().as_bytes()).await?;
                    return Ok(());
                }
            };
        let step = match got {
            Line::Eof => return Ok(()),
            Line::Piece => {
                // Skip the rest of the long line before answering it.
                loop {
                    match tokio::time::timeout(
                        timeouts.command,
                        read_line_bounded(&mut read, MAX_COMMAND_LINE, &mut line),
                    )
                    .await
                    {
                        Ok(Ok(Line::Piece)) => continue,
                        Ok(Ok(_)) => break,
                        Ok(Err(e)) => return Err(e),
                        Err(_) => {
                            write.write_all(timeout_reply.render().as_bytes()).await?;
                            return Ok(());
                        }
                    }
                }
                session.line_too_long()
            }
            Line::Full => session.command(parse_command(trim_eol(&line))),
        };
        match step {
            Step::Reply(reply) => write.write_all(reply.render().as_bytes()).await?,
            Step::Close(reply) => {
                write.write_all(reply.render().as_bytes()).await?;
                write.shutdown().await?;
                return Ok(());
            }
            Step::StartData(reply) => {
                write.write_all(reply.render().as_bytes()).await?;
                let body = match tokio::time::timeout(timeouts.data, read_data(&mut read, &mut line)).await {
                    Ok(Ok(Some(body))) => body,
                    // End of stream inside DATA: the transaction is abandoned.
                    Ok(Ok(None)) => return Ok(()),
                    Ok(Err(e)) => return Err(e),
                    Err(_) => {
                        write.write_all(timeout_reply.render().as_bytes()).await?;
                        return Ok(());
                    }
                };
                let Some((from, to)) = session.finish_data() else {
                    return Ok(());
                };
                let reply = match body.finish() {
                    Ok(raw) => deliver.deliver(from, to, raw).await,
                    Err(reply) => reply,
                };
                write.write_all(reply.render().as_bytes()).await?;
            }
        }
    }
}

/// Reads DATA lines to the end marker; `None` at end of stream.
async fn read_data<R: AsyncBufRead + Unpin>(read: &mut R, line: &mut Vec<u8>) -> std::io::Result<Option<DataBody>> {
    let mut body = DataBody::new(MAX_RAW_BYTES);
    loop {
        match read_line_bounded(read, MAX_TEXT_LINE, line).await? {
            Line::Eof => return Ok(None),
            Line::Piece => {
                body.mark_line_too_long();
                body.push_line(line);
            }
            Line::Full if !line.ends_with(b"\n") => return Ok(None),
            Line::Full => {
                if body.push_line(line) == DataLine::End {
                    return Ok(Some(body));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

    use super::*;

    fn service() -> Mailbox {
        Mailbox::parse("network@example.test").unwrap()
    }

    #[test]
    fn commands_parse_case_insensitively_with_their_paths() {
        assert_eq!(parse_command(b"ehlo mx.example.test"), Ok(Command::Ehlo("mx.example.test".into())));
        assert_eq!(
            parse_command(b"MAIL FROM:<alice@example.test> SIZE=1200 BODY=8BITMIME"),
            Ok(Command::Mail { path: "alice@example.test".into(), size: Some(1200) })
        );
        assert_eq!(parse_command(b"mail from: <>"), Ok(Command::Mail { path: String::new(), size: None }));
        assert_eq!(parse_command(b"RCPT TO:<network@example.test>"), Ok(Command::Rcpt("network@example.test".into())));
        assert_eq!(parse_command(b"DATA"), Ok(Command::Data));
        assert_eq!(parse_command(b"NOOP anything"), Ok(Command::Noop));
    }

    #[test]
    fn malformed_commands_are_refused_with_their_kind() {
        assert_eq!(parse_command(b"MAIL FROM:alice@example.test"), Err(ParseError::Syntax));
        assert_eq!(parse_command(b"MAIL FROM:<alice@example.test> SMTPUTF8"), Err(ParseError::Parameter));
        assert_eq!(parse_command(b"MAIL FROM:<alice@example.test> SIZE=x"), Err(ParseError::Syntax));
        assert_eq!(parse_command(b"RCPT TO:<@relay:bob@example.test>"), Err(ParseError::Syntax));
        assert_eq!(parse_command(b"RCPT TO:<>"), Err(ParseError::Syntax));
        assert_eq!(parse_command(b"DATA now"), Err(ParseError::Syntax));
        assert_eq!(parse_command(b"VRFY bob"), Err(ParseError::Unrecognized));
        assert_eq!(parse_command("EHLO h\u{e9}".as_bytes()), Err(ParseError::NonAscii));
        assert_eq!(parse_command(b"EHLO"), Err(ParseError::Syntax));
    }

    #[test]
    fn only_the_service_mailbox_is_a_recipient_and_only_once() {
        let mut s = Session::new(service(), "asnet.test");
        assert_eq!(
            s.command(parse_command(b"MAIL FROM:<a@example.test>")).clone(),
            Step::Reply(Reply::new(503, "5.5.1 EHLO first"))
        );
        assert!(matches!(s.command(parse_command(b"EHLO mx")), Step::Reply(r) if r.code == 250));
        assert!(matches!(s.command(parse_command(b"DATA")), Step::Reply(r) if r.code == 503));
        assert!(matches!(s.command(parse_command(b"MAIL FROM:<a@example.test>")), Step::Reply(r) if r.code == 250));
        assert!(matches!(s.command(parse_command(b"RCPT TO:<bob@example.test>")), Step::Reply(r) if r.code == 550));
        assert!(matches!(s.command(parse_command(b"RCPT TO:<network@EXAMPLE.test>")), Step::Reply(r) if r.code == 250));
        assert!(matches!(s.command(parse_command(b"RCPT TO:<network@example.test>")), Step::Reply(r) if r.code == 452));
        assert!(matches!(s.command(parse_command(b"DATA")), Step::StartData(r) if r.code == 354));
        assert_eq!(s.finish_data(), Some(("a@example.test".into(), "network@EXAMPLE.test".into())));
        assert!(matches!(s.command(parse_command(b"DATA")), Step::Reply(r) if r.code == 503), "transaction ended");
    }

    #[test]
    fn a_declared_size_over_the_limit_is_refused_at_mail() {
        let mut s = Session::new(service(), "asnet.test");
        s.command(parse_command(b"HELO mx"));
        let step = s.command(parse_command(b"MAIL FROM:<a@example.test> SIZE=40000"));
        assert!(matches!(step, Step::Reply(r) if r.code == 552));
    }

    #[test]
    fn ten_errors_in_a_row_close_the_connection() {
        let mut s = Session::new(service(), "asnet.test");
        for _ in 0..9 {
            assert!(matches!(s.command(parse_command(b"BOGUS")), Step::Reply(_)));
        }
        assert!(matches!(s.command(parse_command(b"BOGUS")), Step::Close(r) if r.code == 421));
    }

    #[test]
    fn data_is_unstuffed_and_ends_at_the_lone_dot() {
        let mut body = DataBody::new(MAX_RAW_BYTES);
        assert_eq!(body.push_line(b"..leading dot\r\n"), DataLine::More);
        assert_eq!(body.push_line(b"plain\r\n"), DataLine::More);
        assert_eq!(body.push_line(b".\r\n"), DataLine::End);
        assert_eq!(body.finish().unwrap(), b".leading dot\r\nplain\r\n");
    }

    #[test]
    fn data_over_the_raw_limit_is_refused_without_keeping_it() {
        let mut body = DataBody::new(100);
        for _ in 0..20 {
            body.push_line(b"0123456789\r\n");
        }
        assert!(body.raw.is_empty());
        assert_eq!(body.finish().unwrap_err().code, 552);
    }

    #[test]
    fn multiline_replies_use_dashes_until_the_last_line() {
        let r = Reply { code: 250, lines: vec!["a".into(), "b".into()] };
        assert_eq!(r.render(), "250-a\r\n250 b\r\n");
    }

    struct Recorder(std::sync::Mutex<Vec<(String, String, Vec<u8>)>>);

    impl Deliver for Recorder {
        async fn deliver(&self, from: String, to: String, raw: Vec<u8>) -> Reply {
            self.0.lock().unwrap().push((from, to, raw));
            Reply::new(250, "2.0.0 Ok")
        }
    }

    async fn converse(input: &[u8], timeouts: Timeouts) -> (String, Vec<(String, String, Vec<u8>)>) {
        let (client, server) = tokio::io::duplex(1 << 16);
        let recorder = Recorder(std::sync::Mutex::new(Vec::new()));
        let (mut cr, mut cw) = tokio::io::split(client);
        cw.write_all(input).await.unwrap();
        let serve = serve_connection(server, Session::new(service(), "asnet.test"), timeouts, &recorder);
        let read = async {
            let mut out = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut cr, &mut out).await.unwrap();
            out
        };
        // The server closes on QUIT or timeout; the client half stays open for reading.
        let (served, out) = tokio::join!(serve, read);
        served.unwrap();
        drop(cw);
        (String::from_utf8(out).unwrap(), recorder.0.into_inner().unwrap())
    }

    #[tokio::test]
    async fn a_pipelined_transaction_delivers_one_unstuffed_message() {
        let input = b"EHLO mx\r\nMAIL FROM:<a@example.test>\r\nRCPT TO:<network@example.test>\r\nDATA\r\nSubject: x\r\n\r\n..hi\r\n.\r\nQUIT\r\n";
        let (out, got) = converse(input, Timeouts::default()).await;
        assert!(out.starts_with("220 "));
        assert!(out.contains("354 "));
        assert!(out.ends_with("250 2.0.0 Ok\r\n221 2.0.0 Bye\r\n"), "{out}");
        assert_eq!(
            got,
            vec![("a@example.test".into(), "network@example.test".into(), b"Subject: x\r\n\r\n.hi\r\n".to_vec())]
        );
    }

    #[tokio::test]
    async fn an_overlong_command_line_is_refused_and_the_session_continues() {
        let mut input = b"EHLO ".to_vec();
        input.extend(std::iter::repeat_n(b'a', 2000));
        input.extend_from_slice(b"\r\nNOOP\r\nQUIT\r\n");
        let (out, _) = converse(&input, Timeouts::default()).await;
        assert!(out.contains("500 5.5.6 Line too long\r\n250 2.0.0 Ok\r\n221"), "{out}");
    }

    #[tokio::test]
    async fn an_overlong_data_line_refuses_the_message() {
        let mut input = b"HELO mx\r\nMAIL FROM:<a@example.test>\r\nRCPT TO:<network@example.test>\r\nDATA\r\n".to_vec();
        input.extend(std::iter::repeat_n(b'a', 1500));
        input.extend_from_slice(b"\r\n.\r\nQUIT\r\n");
        let (out, got) = converse(&input, Timeouts::default()).await;
        assert!(out.contains("500 5.5.6 Line too long\r\n221"), "{out}");
        assert!(got.is_empty());
    }

    #[tokio::test]
    async fn a_silent_client_is_closed_after_the_command_timeout() {
        let (client, server) = tokio::io::duplex(1024);
        let recorder = Recorder(std::sync::Mutex::new(Vec::new()));
        let timeouts = Timeouts { command: Duration::from_millis(200), data: Duration::from_secs(1) };
        let started = std::time::Instant::now();
        let (mut cr, _cw) = tokio::io::split(client);
        serve_connection(server, Session::new(service(), "asnet.test"), timeouts, &recorder).await.unwrap();
        let mut out = vec![0u8; 256];
        let mut text = String::new();
        while !text.contains("421") {
            let n = tokio::io::AsyncReadExt::read(&mut cr, &mut out).await.unwrap();
            text.push_str(std::str::from_utf8(&out[..n]).unwrap());
        }
        assert!(text.contains("421 4.4.2 Timeout"), "{text}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
