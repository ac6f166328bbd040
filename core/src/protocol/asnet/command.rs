//! The ASNET/1 command codec: one UTF-8 JSON object of at most 4,096 bytes is the whole body.
//!
//! - size is checked before parsing; parsing is core's strict I-JSON parser
//!   ([`crate::protocol::agent_identity::json`]), which refuses duplicate member names after
//!   unescaping (so `"\u0061"` duplicates `"a"`), invalid UTF-8, trailing data and deep nesting;
//! - `protocol` must be exactly `ASNET/1` (unknown versions fail closed), `command` one of the
//!   seven names, case-sensitive; each command has an exact field set, nothing more or less
//!   (only `REGISTER`'s `discovery` is optional);
//! - identifiers, codes and scopes are checked for their exact formats here, so the service only
//!   sees typed values.

use serde_json::{Map, Value as Json};

use super::{ChallengeId, Code, FormatError, MAX_BODY_BYTES, MemberId, PROTOCOL, RequestId, Scope, Scopes};
use crate::protocol::agent_identity::json::{self, JsonError, Object, Value};

/// A parsed, fully validated command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// A protected command: answered only with a challenge to the sender's mailbox.
    Protected(Action),
    /// `VERIFY`: redeems a challenge.
    Verify {
        /// The challenge to redeem.
        challenge_id: ChallengeId,
        /// The code mailed with it.
        code: Code,
    },
    /// `LOOKUP`: public, answered at once.
    Lookup {
        /// The member looked up.
        member_id: MemberId,
    },
}

/// The exact action a challenge authorizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `REGISTER`; `None` keeps an existing member's discovery choice (new members: false).
    Register {
        /// The optional discovery choice.
        discovery: Option<bool>,
    },
    /// `CONNECT`: propose an offer to another member.
    Connect {
        /// The invitee.
        member_id: MemberId,
        /// The proposed scopes.
        scopes: Scopes,
    },
    /// `ACCEPT`: the invitee accepts an offer with a subset of its scopes.
    Accept {
        /// The offer.
        request_id: RequestId,
        /// The accepted scopes.
        scopes: Scopes,
    },
    /// `LIST CONNECTIONS`: a private read of the caller's neighbours.
    ListConnections,
    /// `DISCONNECT`: remove the edge and pending offers between the caller and a member.
    Disconnect {
        /// The other member.
        member_id: MemberId,
    },
}

/// Why a body is not a command. Always the sender's fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// The body exceeds 4,096 bytes.
    #[error("command body exceeds {MAX_BODY_BYTES} bytes")]
    TooLarge,
    /// Not strict JSON (includes duplicate keys, escaped or not).
    #[error("body is not strict JSON: {0}")]
    Json(#[from] JsonError),
    /// The JSON value is not an object.
    #[error("body is not a JSON object")]
    NotAnObject,
    /// A required field is missing.
    #[error("missing field {0}")]
    MissingField(&'static str),
    /// A field outside the command's set (names are not echoed: bodies stay out of logs).
    #[error("field not allowed for this command")]
    UnknownField,
    /// A field has the wrong JSON type.
    #[error("field {0} has the wrong type")]
    WrongType(&'static str),
    /// `protocol` is not `ASNET/1`.
    #[error("unsupported protocol version")]
    UnsupportedProtocol,
    /// `command` is not one of the seven commands.
    #[error("unknown command")]
    UnknownCommand,
    /// An identifier, code or scope has the wrong format.
    #[error("{0}")]
    Format(#[from] FormatError),
    /// `scopes` is empty or repeats a scope.
    #[error("scopes must be a nonempty set of distinct scopes")]
    InvalidScopes,
}

const REGISTER: &str = "REGISTER";
const VERIFY: &str = "VERIFY";
const LOOKUP: &str = "LOOKUP";
const CONNECT: &str = "CONNECT";
const ACCEPT: &str = "ACCEPT";
const LIST_CONNECTIONS: &str = "LIST CONNECTIONS";
const DISCONNECT: &str = "DISCONNECT";

impl Command {
    /// Parses a command body.
    pub fn parse(body: &[u8]) -> Result<Self, CommandError> {
        if body.len() > MAX_BODY_BYTES {
            return Err(CommandError::TooLarge);
        }
        let value = json::parse(body)?;
        let obj = value.as_object().ok_or(CommandError::NotAnObject)?;
        match obj.get("protocol") {
            None => return Err(CommandError::MissingField("protocol")),
            Some(Value::String(p)) if p == PROTOCOL => {}
            Some(Value::String(_)) => return Err(CommandError::UnsupportedProtocol),
            Some(_) => return Err(CommandError::WrongType("protocol")),
        }
        let name = match obj.get("command") {
            None => return Err(CommandError::MissingField("command")),
            Some(Value::String(c)) => c.as_str(),
            Some(_) => return Err(CommandError::WrongType("command")),
        };
        match name {
            REGISTER => {
                only(obj, &["discovery"])?;
                let discovery = match obj.get("discovery") {
                    None => None,
                    Some(Value::Bool(b)) => Some(*b),
                    Some(_) => return Err(CommandError::WrongType("discovery")),
                };
                Ok(Command::Protected(Action::Register { discovery }))
            }
            VERIFY => {
                only(obj, &["challengeId", "code"])?;
                let challenge_id = ChallengeId::parse(string(obj, "challengeId")?)?;
                let code = Code::parse(string(obj, "code")?)?;
                Ok(Command::Verify { challenge_id, code })
            }
            LOOKUP => {
                only(obj, &["memberId"])?;
                Ok(Command::Lookup { member_id: MemberId::parse(string(obj, "memberId")?)? })
            }
            CONNECT => {
                only(obj, &["memberId", "scopes"])?;
                let member_id = MemberId::parse(string(obj, "memberId")?)?;
                Ok(Command::Protected(Action::Connect { member_id, scopes: scopes(obj)? }))
            }
            ACCEPT => {
                only(obj, &["requestId", "scopes"])?;
                let request_id = RequestId::parse(string(obj, "requestId")?)?;
                Ok(Command::Protected(Action::Accept { request_id, scopes: scopes(obj)? }))
            }
            LIST_CONNECTIONS => {
                only(obj, &[])?;
                Ok(Command::Protected(Action::ListConnections))
            }
            DISCONNECT => {
                only(obj, &["memberId"])?;
                Ok(Command::Protected(Action::Disconnect { member_id: MemberId::parse(string(obj, "memberId")?)? }))
            }
            _ => Err(CommandError::UnknownCommand),
        }
    }

    /// The command as a JSON object (members sorted by name), the form a client sends.
    pub fn to_json(&self) -> Json {
        match self {
            Command::Protected(action) => action.to_json(),
            Command::Verify { challenge_id, code } => {
                base(VERIFY).with("challengeId", challenge_id.to_string()).with("code", code.to_string()).into()
            }
            Command::Lookup { member_id } => base(LOOKUP).with("memberId", member_id.to_string()).into(),
        }
    }

    /// The compact JSON text of [`Command::to_json`].
    pub fn to_body(&self) -> String {
        self.to_json().to_string()
    }
}

impl Action {
    /// The exact command this action came from, as a JSON object (the `action` of a challenge).
    pub fn to_json(&self) -> Json {
        match self {
            Action::Register { discovery: None } => base(REGISTER).into(),
            Action::Register { discovery: Some(d) } => base(REGISTER).with("discovery", *d).into(),
            Action::Connect { member_id, scopes } => {
                base(CONNECT).with("memberId", member_id.to_string()).with("scopes", scopes.names()).into()
            }
            Action::Accept { request_id, scopes } => {
                base(ACCEPT).with("requestId", request_id.to_string()).with("scopes", scopes.names()).into()
            }
            Action::ListConnections => base(LIST_CONNECTIONS).into(),
            Action::Disconnect { member_id } => base(DISCONNECT).with("memberId", member_id.to_string()).into(),
        }
    }

    /// The storage form: the compact command text, read back with [`Action::from_stored`].
    pub fn to_stored(&self) -> String {
        self.to_json().to_string()
    }

    /// Reads the storage form; `None` if it is not a protected command (a corrupt store).
    pub fn from_stored(text: &str) -> Option<Self> {
        match Command::parse(text.as_bytes()).ok()? {
            Command::Protected(action) => Some(action),
            _ => None,
        }
    }

    /// The command name.
    pub fn name(&self) -> &'static str {
        match self {
            Action::Register { .. } => REGISTER,
            Action::Connect { .. } => CONNECT,
            Action::Accept { .. } => ACCEPT,
            Action::ListConnections => LIST_CONNECTIONS,
            Action::Disconnect { .. } => DISCONNECT,
        }
    }
}

/// A small builder over `serde_json`'s map.
struct JsonObject(Map<String, Json>);

impl JsonObject {
    fn with(mut self, key: &str, value: impl Into<Json>) -> Self {
        self.0.insert(key.to_owned(), value.into());
        self
    }
}

impl From<JsonObject> for Json {
    fn from(o: JsonObject) -> Self {
        Json::Object(o.0)
    }
}

fn base(command: &str) -> JsonObject {
    JsonObject(Map::new()).with("protocol", PROTOCOL).with("command", command)
}

/// Refuses any member besides `protocol`, `command` and `allowed`.
fn only(obj: &Object, allowed: &[&str]) -> Result<(), CommandError> {
    if obj.keys().all(|k| k == "protocol" || k == "command" || allowed.contains(&k)) {
        Ok(())
    } else {
        Err(CommandError::UnknownField)
    }
}

fn string<'a>(obj: &'a Object, key: &'static str) -> Result<&'a str, CommandError> {
    match obj.get(key) {
        None => Err(CommandError::MissingField(key)),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(CommandError::WrongType(key)),
    }
}

fn scopes(obj: &Object) -> Result<Scopes, CommandError> {
    let items = match obj.get("scopes") {
        None => return Err(CommandError::MissingField("scopes")),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(CommandError::WrongType("scopes")),
    };
    let mut out = Vec::with_capacity(items.len().min(Scope::ALL.len()));
    for item in items {
        let name = item.as_str().ok_or(CommandError::WrongType("scopes"))?;
        out.push(Scope::parse(name)?);
        if out.len() > Scope::ALL.len() {
            // More entries than scopes exist: there must be a duplicate.
            return Err(CommandError::InvalidScopes);
        }
    }
    Scopes::new(out).ok_or(CommandError::InvalidScopes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEM: &str = "mem_0123456789abcdef0123456789abcdef";

    #[test]
    fn every_command_round_trips_through_its_json() {
        let bodies = [
            r#"{"protocol":"ASNET/1","command":"REGISTER"}"#.to_owned(),
            r#"{"protocol":"ASNET/1","command":"REGISTER","discovery":false}"#.to_owned(),
            r#"{"protocol":"ASNET/1","command":"VERIFY","challengeId":"chl_0123456789abcdef0123456789abcdef","code":"0123456789abcdef0123456789abcdef"}"#.to_owned(),
            format!(r#"{{"protocol":"ASNET/1","command":"LOOKUP","memberId":"{MEM}"}}"#),
            format!(r#"{{"protocol":"ASNET/1","command":"CONNECT","memberId":"{MEM}","scopes":["profile:basic","contact:email"]}}"#),
            r#"{"protocol":"ASNET/1","command":"ACCEPT","requestId":"req_0123456789abcdef0123456789abcdef","scopes":["contact:email"]}"#.to_owned(),
            r#"{"protocol":"ASNET/1","command":"LIST CONNECTIONS"}"#.to_owned(),
            format!(r#"{{"protocol":"ASNET/1","command":"DISCONNECT","memberId":"{MEM}"}}"#),
        ];
        for body in bodies {
            let cmd = Command::parse(body.as_bytes()).unwrap_or_else(|e| panic!("{body}: {e}"));
            assert_eq!(Command::parse(cmd.to_body().as_bytes()).unwrap(), cmd, "{body}");
            let given: Json = serde_json::from_str(&body).unwrap();
            assert_eq!(cmd.to_json(), given, "the encoding is the exact command");
        }
    }

    #[test]
    fn a_command_surrounded_by_mail_line_breaks_parses() {
        let body = "\r\n{\"protocol\":\"ASNET/1\",\r\n \"command\":\"LIST CONNECTIONS\"}\r\n";
        assert_eq!(Command::parse(body.as_bytes()), Ok(Command::Protected(Action::ListConnections)));
    }

    #[test]
    fn scope_lists_with_more_entries_than_scopes_are_refused_early() {
        let body = r#"{"protocol":"ASNET/1","command":"ACCEPT","requestId":"req_0123456789abcdef0123456789abcdef","scopes":["contact:email","profile:basic","contact:email"]}"#;
        assert_eq!(Command::parse(body.as_bytes()), Err(CommandError::InvalidScopes));
    }
}
