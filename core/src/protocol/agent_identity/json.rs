//! Strict I-JSON parsing (RFC 7493 as Agent Identity §4.1 narrows it) and RFC 8785 JCS output.
//!
//! - [`parse`] takes raw bytes and refuses duplicate member names at any depth, unpaired
//!   surrogate escapes, integers outside ±(2^53 − 1), non-integer numbers (no Agent Protocols
//!   schema uses them, so refusing them removes the one hard part of JCS), invalid UTF-8, raw
//!   control characters, trailing data and nesting deeper than [`MAX_DEPTH`].
//! - [`Value`] keeps object members in input order so a parsed document can be re-emitted exactly;
//!   [`to_jcs`] sorts members by UTF-16 code units and escapes strings as JCS requires.

use std::collections::HashSet;
use std::fmt::Write as _;

/// The largest integer magnitude I-JSON can carry exactly: 2^53 − 1.
pub const MAX_SAFE_INTEGER: i64 = 9_007_199_254_740_991;
/// Deepest nesting of arrays and objects the parser accepts (bounded recursion).
pub const MAX_DEPTH: usize = 64;

/// A strictly parsed JSON value. Numbers are always safe integers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// An integer in ±(2^53 − 1).
    Int(i64),
    /// A string of Unicode scalar values.
    String(String),
    /// An array.
    Array(Vec<Value>),
    /// An object with unique member names.
    Object(Object),
}

/// A JSON object: unique member names, kept in insertion order (JCS sorts only on output).
#[derive(Debug, Clone, Default, Eq)]
pub struct Object {
    members: Vec<(String, Value)>,
}

impl PartialEq for Object {
    /// Objects are equal when they have the same members, whatever their order.
    fn eq(&self, other: &Self) -> bool {
        self.members.len() == other.members.len() && self.members.iter().all(|(k, v)| other.get(k) == Some(v))
    }
}

impl Object {
    /// An empty object.
    pub fn new() -> Self {
        Self::default()
    }

    /// The member named `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.members.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Whether a member named `key` exists.
    pub fn contains_key(&self, key: &str) -> bool {
        self.members.iter().any(|(k, _)| k == key)
    }

    /// Sets `key` (replacing an existing member in place), returning the old value.
    pub fn insert(&mut self, key: impl Into<String>, value: Value) -> Option<Value> {
        let key = key.into();
        if let Some((_, slot)) = self.members.iter_mut().find(|(k, _)| *k == key) {
            return Some(std::mem::replace(slot, value));
        }
        self.members.push((key, value));
        None
    }

    /// Builder form of [`Object::insert`].
    pub fn with(mut self, key: impl Into<String>, value: impl Into<Value>) -> Self {
        self.insert(key, value.into());
        self
    }

    /// Removes and returns the member named `key`.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let at = self.members.iter().position(|(k, _)| k == key)?;
        Some(self.members.remove(at).1)
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the object has no members.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Members in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.members.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Member names in insertion order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|(k, _)| k.as_str())
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}
impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Int(v)
    }
}
impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Int(i64::from(v))
    }
}
impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::String(v.to_owned())
    }
}
impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::String(v)
    }
}
impl From<Object> for Value {
    fn from(v: Object) -> Self {
        Value::Object(v)
    }
}
impl From<Vec<Value>> for Value {
    fn from(v: Vec<Value>) -> Self {
        Value::Array(v)
    }
}

impl Value {
    /// The object, if this is one.
    pub fn as_object(&self) -> Option<&Object> {
        match self {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }

    /// The string, if this is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The integer, if this is one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// The array, if this is one.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Whether `null` appears anywhere in this value.
    pub fn contains_null(&self) -> bool {
        match self {
            Value::Null => true,
            Value::Array(a) => a.iter().any(Value::contains_null),
            Value::Object(o) => o.iter().any(|(_, v)| v.contains_null()),
            _ => false,
        }
    }

    /// A short name of the JSON type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Int(_) => "integer",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }
}

/// Why a JSON text was refused. Every variant is the sender's fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    /// The bytes are not UTF-8.
    #[error("JSON text is not valid UTF-8")]
    InvalidUtf8,
    /// Not JSON at all (or a raw control character inside a string).
    #[error("JSON syntax error at byte {0}")]
    Syntax(usize),
    /// An object repeats a member name.
    #[error("duplicate member name {0:?}")]
    DuplicateKey(String),
    /// A member name serde_json reserves for itself: with its `raw_value` feature (on in this
    /// build, through other crates) it reads such an object as raw JSON text, not as an object,
    /// so accepting it would let this parser and serde_json see two different values.
    #[error("reserved member name {0:?}")]
    ReservedKey(String),
    /// A `\u` escape leaves a surrogate unpaired.
    #[error("unpaired surrogate escape at byte {0}")]
    UnpairedSurrogate(usize),
    /// An integer outside ±(2^53 − 1).
    #[error("integer outside the safe range at byte {0}")]
    UnsafeInteger(usize),
    /// A number with a fraction or exponent.
    #[error("non-integer number at byte {0}")]
    NonInteger(usize),
    /// Nesting deeper than [`MAX_DEPTH`].
    #[error("nesting deeper than {MAX_DEPTH}")]
    TooDeep,
    /// Something follows the top-level value.
    #[error("trailing data at byte {0}")]
    TrailingData(usize),
}

/// The prefix of serde_json's private magic member names (`$serde_json::private::RawValue`).
const SERDE_JSON_PRIVATE: &str = "$serde_json::private::";

/// Parses one strict I-JSON text.
pub fn parse(bytes: &[u8]) -> Result<Value, JsonError> {
    let text = std::str::from_utf8(bytes).map_err(|_| JsonError::InvalidUtf8)?;
    let mut p = Parser { text, bytes: text.as_bytes(), pos: 0 };
    p.skip_ws();
    let value = p.value(0)?;
    p.skip_ws();
    if p.pos != p.bytes.len() {
        return Err(JsonError::TrailingData(p.pos));
    }
    Ok(value)
}

/// Parses strictly and returns the JCS form.
pub fn canonicalize(bytes: &[u8]) -> Result<Vec<u8>, JsonError> {
    Ok(to_jcs(&parse(bytes)?))
}

struct Parser<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn expect_literal(&mut self, lit: &str, value: Value) -> Result<Value, JsonError> {
        if self.bytes.get(self.pos..self.pos + lit.len()) == Some(lit.as_bytes()) {
            self.pos += lit.len();
            Ok(value)
        } else {
            Err(JsonError::Syntax(self.pos))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, JsonError> {
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => Ok(Value::String(self.string()?)),
            Some(b't') => self.expect_literal("true", Value::Bool(true)),
            Some(b'f') => self.expect_literal("false", Value::Bool(false)),
            Some(b'n') => self.expect_literal("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(JsonError::Syntax(self.pos)),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, JsonError> {
        if depth > MAX_DEPTH {
            return Err(JsonError::TooDeep);
        }
        self.pos += 1; // '{'
        let mut obj = Object::new();
        let mut seen: HashSet<String> = HashSet::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Value::Object(obj));
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(JsonError::Syntax(self.pos));
            }
            let key = self.string()?;
            if key.starts_with(SERDE_JSON_PRIVATE) {
                return Err(JsonError::ReservedKey(key));
            }
            if !seen.insert(key.clone()) {
                return Err(JsonError::DuplicateKey(key));
            }
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(JsonError::Syntax(self.pos));
            }
            self.pos += 1;
            self.skip_ws();
            let value = self.value(depth)?;
            obj.members.push((key, value));
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Value::Object(obj));
                }
                _ => return Err(JsonError::Syntax(self.pos)),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, JsonError> {
        if depth > MAX_DEPTH {
            return Err(JsonError::TooDeep);
        }
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Value::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Value::Array(items));
                }
                _ => return Err(JsonError::Syntax(self.pos)),
            }
        }
    }

    fn hex4(&mut self) -> Result<u16, JsonError> {
        let digits = self.text.get(self.pos..self.pos + 4).ok_or(JsonError::Syntax(self.pos))?;
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(JsonError::Syntax(self.pos));
        }
        let v = u16::from_str_radix(digits, 16).map_err(|_| JsonError::Syntax(self.pos))?;
        self.pos += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, JsonError> {
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            // Copy the longest run of plain characters at once.
            let start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            out.push_str(self.text.get(start..self.pos).ok_or(JsonError::Syntax(start))?);
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    let at = self.pos;
                    self.pos += 1;
                    let esc = self.peek().ok_or(JsonError::Syntax(self.pos))?;
                    self.pos += 1;
                    match esc {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let unit = self.hex4()?;
                            let c = match unit {
                                0xD800..=0xDBFF => {
                                    if self.bytes.get(self.pos..self.pos + 2) != Some(b"\\u") {
                                        return Err(JsonError::UnpairedSurrogate(at));
                                    }
                                    self.pos += 2;
                                    let low = self.hex4()?;
                                    if !(0xDC00..=0xDFFF).contains(&low) {
                                        return Err(JsonError::UnpairedSurrogate(at));
                                    }
                                    let cp = 0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(low) - 0xDC00);
                                    char::from_u32(cp).ok_or(JsonError::UnpairedSurrogate(at))?
                                }
                                0xDC00..=0xDFFF => return Err(JsonError::UnpairedSurrogate(at)),
                                _ => char::from_u32(u32::from(unit)).ok_or(JsonError::Syntax(at))?,
                            };
                            out.push(c);
                        }
                        _ => return Err(JsonError::Syntax(at)),
                    }
                }
                // A raw control character or the end of input.
                _ => return Err(JsonError::Syntax(self.pos)),
            }
        }
    }

    fn number(&mut self) -> Result<Value, JsonError> {
        let start = self.pos;
        let negative = self.peek() == Some(b'-');
        if negative {
            self.pos += 1;
        }
        let digits_start = self.pos;
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                while matches!(self.peek(), Some(b'0'..=b'9')) {
                    self.pos += 1;
                }
            }
            _ => return Err(JsonError::Syntax(self.pos)),
        }
        if matches!(self.peek(), Some(b'.' | b'e' | b'E')) {
            return Err(JsonError::NonInteger(start));
        }
        let digits = self.text.get(digits_start..self.pos).ok_or(JsonError::Syntax(start))?;
        // 16 digits always fit in i64; anything longer is certainly outside the safe range.
        if digits.len() > 16 {
            return Err(JsonError::UnsafeInteger(start));
        }
        let magnitude: i64 = digits.parse().map_err(|_| JsonError::Syntax(start))?;
        if magnitude > MAX_SAFE_INTEGER {
            return Err(JsonError::UnsafeInteger(start));
        }
        Ok(Value::Int(if negative { -magnitude } else { magnitude }))
    }
}

/// The RFC 8785 canonical form of `value`.
pub fn to_jcs(value: &Value) -> Vec<u8> {
    let mut out = String::new();
    write_jcs(value, &mut out);
    out.into_bytes()
}

/// The RFC 8785 canonical form of `value`, as a string.
pub fn to_jcs_string(value: &Value) -> String {
    let mut out = String::new();
    write_jcs(value, &mut out);
    out
}

/// The JCS form of an object given as borrowed members (names must be unique). Lets a caller
/// canonicalize a large structure without first copying it into a [`Value`].
pub fn object_to_jcs(members: &[(&str, &Value)]) -> String {
    let mut sorted: Vec<&(&str, &Value)> = members.iter().collect();
    sorted.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
    let mut out = String::new();
    out.push('{');
    for (i, (k, v)) in sorted.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(k, &mut out);
        out.push(':');
        write_jcs(v, &mut out);
    }
    out.push('}');
    out
}

fn write_jcs(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        // Safe integers print the same in ECMAScript's Number::toString and in Rust.
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_jcs(item, out);
            }
            out.push(']');
        }
        Value::Object(obj) => {
            let mut members: Vec<&(String, Value)> = obj.members.iter().collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push('{');
            for (i, (k, v)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(k, out);
                out.push(':');
                write_jcs(v, out);
            }
            out.push('}');
        }
    }
}

/// JCS string serialization (ECMAScript `JSON.stringify`): only `"`, `\` and C0 controls are
/// escaped; the two-letter forms where they exist, lower-case `\u00xx` otherwise.
fn write_string(s: &str, out: &mut String) {
    out.reserve(s.len() + 2);
    out.push('"');
    // Runs of characters that need no escape are copied whole; every escaped character is ASCII,
    // so a run always ends on a character boundary.
    let mut run = 0;
    for (i, b) in s.bytes().enumerate() {
        let esc = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            0x0c => "\\f",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(s.get(run..i).unwrap_or_default());
        if esc.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(esc);
        }
        run = i + 1;
    }
    out.push_str(s.get(run..).unwrap_or_default());
    out.push('"');
}

impl serde::Serialize for Value {
    /// Serializes members in their stored order (use [`to_jcs`] for canonical bytes).
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self {
            Value::Null => serializer.serialize_unit(),
            Value::Bool(b) => serializer.serialize_bool(*b),
            Value::Int(i) => serializer.serialize_i64(*i),
            Value::String(s) => serializer.serialize_str(s),
            Value::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Object(obj) => {
                let mut map = serializer.serialize_map(Some(obj.len()))?;
                for (k, v) in obj.iter() {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serde_jsons_reserved_member_name_is_refused_even_spelled_with_escapes() {
        // Found by the fuzzer: serde_json (raw_value on) refuses this object, or with a string
        // value reads it as that string's JSON; this parser must not accept what it sees as
        // something else.
        let key = "$serde_json::private::RawValue";
        assert_eq!(parse(br#"{"$serde_json::private::RawValue":1}"#), Err(JsonError::ReservedKey(key.into())));
        assert_eq!(parse(br#"{"a":{"$serde_json::private::RawValue":"1"}}"#), Err(JsonError::ReservedKey(key.into())));
        assert_eq!(parse(br#"{"\u0024serde_json::private::RawValue":"1"}"#), Err(JsonError::ReservedKey(key.into())));
        assert!(serde_json::from_slice::<serde_json::Value>(br#"{"$serde_json::private::RawValue":1}"#).is_err());
        // A name that only resembles it is an ordinary name.
        assert!(parse(br#"{"$serde_json":1,"serde_json::private::RawValue":2}"#).is_ok());
    }

    #[test]
    fn duplicate_member_names_are_refused_at_any_depth() {
        assert_eq!(parse(br#"{"a":1,"a":2}"#), Err(JsonError::DuplicateKey("a".into())));
        assert_eq!(parse(br#"{"x":[{"b":1,"b":1}]}"#), Err(JsonError::DuplicateKey("b".into())));
        // Escapes that spell the same name are still duplicates.
        assert_eq!(parse(br#"{"a":1,"\u0061":2}"#), Err(JsonError::DuplicateKey("a".into())));
    }

    #[test]
    fn numbers_must_be_safe_integers() {
        assert_eq!(parse(b"9007199254740991"), Ok(Value::Int(MAX_SAFE_INTEGER)));
        assert_eq!(parse(b"-9007199254740991"), Ok(Value::Int(-MAX_SAFE_INTEGER)));
        assert!(matches!(parse(b"9007199254740992"), Err(JsonError::UnsafeInteger(_))));
        assert!(matches!(parse(b"123456789012345678901234567890"), Err(JsonError::UnsafeInteger(_))));
        assert!(matches!(parse(b"1.0"), Err(JsonError::NonInteger(_))));
        assert!(matches!(parse(b"1e3"), Err(JsonError::NonInteger(_))));
        assert!(matches!(parse(b"01"), Err(JsonError::TrailingData(_))));
        assert!(matches!(parse(b"-"), Err(JsonError::Syntax(_))));
        assert_eq!(to_jcs(&parse(b"-0").unwrap()), b"0");
    }

    #[test]
    fn strings_follow_json_and_unicode_rules() {
        assert!(matches!(parse(b"\"\x01\""), Err(JsonError::Syntax(_))));
        assert!(matches!(parse(br#""\ud800""#), Err(JsonError::UnpairedSurrogate(_))));
        assert!(matches!(parse(br#""\udc00x""#), Err(JsonError::UnpairedSurrogate(_))));
        assert!(matches!(parse(br#""\ud800\u0041""#), Err(JsonError::UnpairedSurrogate(_))));
        assert!(matches!(parse(br#""\x""#), Err(JsonError::Syntax(_))));
        assert_eq!(parse(br#""\ud83d\ude00""#), Ok(Value::String("😀".into())));
        assert_eq!(parse(b"\"\xff\""), Err(JsonError::InvalidUtf8));
    }

    #[test]
    fn jcs_sorts_by_utf16_and_escapes_minimally() {
        let v = parse("{\"😀\":5,\"！\":4,\"é\":3,\"a\":2,\"B\":1}".as_bytes()).unwrap();
        // U+1F600 is the surrogate pair D83D DE00, which sorts before U+FF01.
        assert_eq!(to_jcs_string(&v), "{\"B\":1,\"a\":2,\"é\":3,\"😀\":5,\"！\":4}");
        let s = parse(br#""\u0000\u001f\"\\\/\b\f\n\r\t\u007f\u2028""#).unwrap();
        assert_eq!(to_jcs_string(&s), "\"\\u0000\\u001f\\\"\\\\/\\b\\f\\n\\r\\t\u{7f}\u{2028}\"");
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(parse(deep.as_bytes()), Err(JsonError::TooDeep));
        let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
        assert!(parse(ok.as_bytes()).is_ok());
    }

    #[test]
    fn object_equality_ignores_member_order() {
        assert_eq!(parse(br#"{"a":1,"b":2}"#).unwrap(), parse(br#"{"b":2,"a":1}"#).unwrap());
    }
}
