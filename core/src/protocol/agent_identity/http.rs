//! HTTP conventions shared by every Agent Protocols service (§8): error bodies and codes, lists,
//! accepted records and discovery documents. Wire shapes only; servers and clients do the I/O.

use super::envelope::{Envelope, EnvelopeError};
pub use super::error_code::ErrorCode;
use super::json::{self, JsonError, Object, Value};
use super::origin::Origin;
use super::shape::{self, ShapeError};

/// An error response body: `{"error": {"code", "message", "data"?}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorBody {
    /// Stable machine-readable code (shared or protocol-defined).
    pub code: String,
    /// Human-readable text; may change.
    pub message: String,
    /// Optional code-specific details.
    pub data: Option<Object>,
}

impl ErrorBody {
    /// A body with no `data`.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self { code: code.to_owned(), message: message.into(), data: None }
    }

    /// The body as JSON.
    pub fn to_value(&self) -> Value {
        let mut inner = Object::new().with("code", self.code.as_str()).with("message", self.message.as_str());
        if let Some(data) = &self.data {
            inner.insert("data", Value::Object(data.clone()));
        }
        Value::Object(Object::new().with("error", inner))
    }

    /// The body as JSON bytes.
    pub fn to_json(&self) -> Vec<u8> {
        json::to_jcs(&self.to_value())
    }

    /// Reads an error body (unknown members inside `error` are ignored, as §8 allows additions).
    pub fn parse(bytes: &[u8]) -> Result<Self, HttpShapeError> {
        let v = json::parse(bytes)?;
        let top = shape::object(&v, "")?;
        let err = shape::object(shape::member(top, "", "error")?, "error")?;
        let code = shape::string(err, "error", "code")?.to_owned();
        let message = shape::string(err, "error", "message")?.to_owned();
        let data = match err.get("data") {
            None => None,
            Some(d) => Some(shape::object(d, "error.data")?.clone()),
        };
        Ok(Self { code, message, data })
    }
}

/// Why a shared HTTP document was refused (the service's or peer's fault).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HttpShapeError {
    /// Not strict I-JSON.
    #[error("not strict I-JSON: {0}")]
    Json(#[from] JsonError),
    /// Wrong shape.
    #[error("invalid document: {0}")]
    Shape(#[from] ShapeError),
    /// An embedded envelope does not verify.
    #[error("embedded envelope: {0}")]
    Envelope(#[from] EnvelopeError),
}

/// An accepted record (§8.3): the original envelope and the service's first acceptance time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedRecord {
    /// The envelope exactly as accepted.
    pub envelope: Envelope,
    /// Service clock at first acceptance (never `created_at`, never changed on resubmission).
    pub accepted_at: i64,
}

impl AcceptedRecord {
    /// The record as JSON.
    pub fn to_value(&self) -> Value {
        Value::Object(Object::new().with("envelope", self.envelope.to_value()).with("accepted_at", self.accepted_at))
    }

    /// Reads a record whose only members are `envelope` and `accepted_at`, verifying the envelope.
    pub fn from_value(value: &Value, extensions: &[&str]) -> Result<Self, HttpShapeError> {
        let obj = shape::object(value, "")?;
        shape::closed(obj, "", &["envelope", "accepted_at"], &[])?;
        let envelope = Envelope::from_value(shape::member(obj, "", "envelope")?, extensions)?;
        let accepted_at = shape::timestamp(obj, "", "accepted_at")?;
        Ok(Self { envelope, accepted_at })
    }
}

/// A list response (§8.2): `{result, next_cursor?}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// The items, in the endpoint's order.
    pub result: Vec<Value>,
    /// Present exactly when more items follow.
    pub next_cursor: Option<String>,
}

impl ListPage {
    /// The page as JSON.
    pub fn to_value(&self) -> Value {
        let mut obj = Object::new().with("result", Value::Array(self.result.clone()));
        if let Some(cursor) = &self.next_cursor {
            obj.insert("next_cursor", Value::from(cursor.as_str()));
        }
        Value::Object(obj)
    }

    /// Reads a page (other top-level members are ignored).
    pub fn parse(bytes: &[u8]) -> Result<Self, HttpShapeError> {
        let v = json::parse(bytes)?;
        let obj = shape::object(&v, "")?;
        let result = shape::array(obj, "", "result")?.to_vec();
        let next_cursor = match obj.get("next_cursor") {
            None => None,
            Some(_) => {
                let c = shape::string(obj, "", "next_cursor")?;
                if c.is_empty() {
                    return Err(ShapeError::new("next_cursor", "must not be empty").into());
                }
                Some(c.to_owned())
            }
        };
        Ok(Self { result, next_cursor })
    }
}

/// A discovery document (§8.4) served at `/.well-known/{protocol-name}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryDocument {
    /// The protocol identifier.
    pub protocol: String,
    /// The service origin (the request JWT audience).
    pub service: Origin,
    /// Endpoint URLs by name, when the protocol defines names.
    pub endpoints: Option<Object>,
    /// Feature strings (unique); clients ignore ones they do not know.
    pub features: Option<Vec<String>>,
}

impl DiscoveryDocument {
    /// The document as JSON.
    pub fn to_value(&self) -> Value {
        let mut obj = Object::new().with("protocol", self.protocol.as_str()).with("service", self.service.as_str());
        if let Some(endpoints) = &self.endpoints {
            obj.insert("endpoints", Value::Object(endpoints.clone()));
        }
        if let Some(features) = &self.features {
            obj.insert("features", Value::Array(features.iter().map(|f| Value::from(f.as_str())).collect()));
        }
        Value::Object(obj)
    }

    /// Reads a document fetched from `fetched_from`, for `protocol`: the `service` must be that
    /// origin. Unknown members are ignored.
    pub fn parse(bytes: &[u8], protocol: &str, fetched_from: &Origin) -> Result<Self, HttpShapeError> {
        let v = json::parse(bytes)?;
        let obj = shape::object(&v, "")?;
        if shape::string(obj, "", "protocol")? != protocol {
            return Err(ShapeError::new("protocol", format!("expected {protocol}")).into());
        }
        let service =
            Origin::parse(shape::string(obj, "", "service")?).map_err(|e| ShapeError::new("service", e.to_string()))?;
        if &service != fetched_from {
            return Err(ShapeError::new("service", "differs from the fetched origin").into());
        }
        let endpoints = match obj.get("endpoints") {
            None => None,
            Some(e) => {
                let e = shape::object(e, "endpoints")?;
                for (name, url) in e.iter() {
                    let url =
                        url.as_str().ok_or_else(|| ShapeError::new(shape::join("endpoints", name), "not a string"))?;
                    if !url.starts_with("https://") {
                        return Err(ShapeError::new(shape::join("endpoints", name), "not an https URL").into());
                    }
                }
                Some(e.clone())
            }
        };
        let features = match obj.get("features") {
            None => None,
            Some(_) => {
                let mut out: Vec<String> = Vec::new();
                for f in shape::array(obj, "", "features")? {
                    let f = f.as_str().ok_or_else(|| ShapeError::new("features", "items must be strings"))?;
                    if out.iter().any(|o| o == f) {
                        return Err(ShapeError::new("features", "items must be unique").into());
                    }
                    out.push(f.to_owned());
                }
                Some(out)
            }
        };
        Ok(Self { protocol: protocol.to_owned(), service, endpoints, features })
    }
}
