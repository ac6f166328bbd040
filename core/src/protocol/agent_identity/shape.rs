//! Typed reading of strictly parsed JSON: closed objects, required members, exact types. `null` is
//! never accepted by these readers, so a protocol that allows no `null` gets that rule for free.

use super::encoding::{Hash32, b64_array, b64_decode};
use super::json::{MAX_SAFE_INTEGER, Object, Value};

/// A JSON document has the wrong shape (the sender's fault): `field` names where, `problem` what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {problem}")]
pub struct ShapeError {
    /// Dotted path of the offending member.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

impl ShapeError {
    /// A shape error at `field`.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self { field: field.into(), problem: problem.into() }
    }
}

/// `value` as an object.
pub fn object<'a>(value: &'a Value, field: &str) -> Result<&'a Object, ShapeError> {
    value.as_object().ok_or_else(|| ShapeError::new(field, format!("expected an object, found {}", value.type_name())))
}

/// Requires that `obj` has every `required` member and nothing outside `required ∪ optional`.
pub fn closed(obj: &Object, field: &str, required: &[&str], optional: &[&str]) -> Result<(), ShapeError> {
    if let Some(unknown) = obj.keys().find(|k| !required.contains(k) && !optional.contains(k)) {
        return Err(ShapeError::new(join(field, unknown), "unknown member"));
    }
    if let Some(missing) = required.iter().find(|k| !obj.contains_key(k)) {
        return Err(ShapeError::new(join(field, missing), "missing"));
    }
    Ok(())
}

/// `parent.child`, or `child` at the top level.
pub fn join(parent: &str, child: &str) -> String {
    if parent.is_empty() { child.to_owned() } else { format!("{parent}.{child}") }
}

/// The member `key`, which must be present.
pub fn member<'a>(obj: &'a Object, parent: &str, key: &str) -> Result<&'a Value, ShapeError> {
    obj.get(key).ok_or_else(|| ShapeError::new(join(parent, key), "missing"))
}

/// A required string member.
pub fn string<'a>(obj: &'a Object, parent: &str, key: &str) -> Result<&'a str, ShapeError> {
    let v = member(obj, parent, key)?;
    v.as_str().ok_or_else(|| ShapeError::new(join(parent, key), format!("expected a string, found {}", v.type_name())))
}

/// A required integer member.
pub fn integer(obj: &Object, parent: &str, key: &str) -> Result<i64, ShapeError> {
    let v = member(obj, parent, key)?;
    v.as_i64()
        .ok_or_else(|| ShapeError::new(join(parent, key), format!("expected an integer, found {}", v.type_name())))
}

/// A required Unix-millisecond timestamp: an integer in `0..=2^53-1`.
pub fn timestamp(obj: &Object, parent: &str, key: &str) -> Result<i64, ShapeError> {
    let v = integer(obj, parent, key)?;
    if !(0..=MAX_SAFE_INTEGER).contains(&v) {
        return Err(ShapeError::new(join(parent, key), "timestamp out of range"));
    }
    Ok(v)
}

/// A required positive safe integer.
pub fn positive(obj: &Object, parent: &str, key: &str) -> Result<u64, ShapeError> {
    let v = integer(obj, parent, key)?;
    if !(1..=MAX_SAFE_INTEGER).contains(&v) {
        return Err(ShapeError::new(join(parent, key), "must be a positive safe integer"));
    }
    u64::try_from(v).map_err(|_| ShapeError::new(join(parent, key), "must be a positive safe integer"))
}

/// A required array member.
pub fn array<'a>(obj: &'a Object, parent: &str, key: &str) -> Result<&'a [Value], ShapeError> {
    let v = member(obj, parent, key)?;
    v.as_array()
        .ok_or_else(|| ShapeError::new(join(parent, key), format!("expected an array, found {}", v.type_name())))
}

/// A required canonical base64url member of any length.
pub fn bytes(obj: &Object, parent: &str, key: &str) -> Result<Vec<u8>, ShapeError> {
    b64_decode(string(obj, parent, key)?).ok_or_else(|| ShapeError::new(join(parent, key), "not canonical base64url"))
}

/// A required canonical base64url member of exactly `N` bytes.
pub fn fixed<const N: usize>(obj: &Object, parent: &str, key: &str) -> Result<[u8; N], ShapeError> {
    b64_array(string(obj, parent, key)?)
        .ok_or_else(|| ShapeError::new(join(parent, key), format!("not canonical base64url of {N} bytes")))
}

/// A required 32-byte hash member.
pub fn hash(obj: &Object, parent: &str, key: &str) -> Result<Hash32, ShapeError> {
    fixed::<32>(obj, parent, key).map(Hash32)
}
