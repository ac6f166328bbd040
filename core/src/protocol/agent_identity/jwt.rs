//! Request JWTs (§7): compact JWS, `alg: EdDSA`, `kid == iss == sub`, `aud` the service origin,
//! short lifetimes in NumericDate seconds, signatures checked with the deterministic rules of §3.1.

use ed25519_dalek::SigningKey;

use super::agent_id::AgentId;
use super::ed25519::{sign, verify_strict};
use super::encoding::{b64, b64_array, b64_decode};
use super::json::{self, Object, Value};
use super::origin::Origin;
use super::shape;

/// Longest token accepted before any decoding.
pub const MAX_TOKEN_LEN: usize = 4096;

/// How strictly lifetimes are judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JwtPolicy {
    /// Largest `exp - iat` accepted (seconds). The SHOULD of §7 is 300.
    pub max_lifetime_secs: i64,
    /// Tolerated clock skew for `iat` in the future and `exp` in the past (seconds).
    pub max_skew_secs: i64,
}

impl Default for JwtPolicy {
    fn default() -> Self {
        Self { max_lifetime_secs: 300, max_skew_secs: 60 }
    }
}

/// The verified claims of a request JWT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestClaims {
    /// The authenticated Agent ID (`kid == iss == sub`).
    pub subject: AgentId,
    /// The audience, equal to the verifying service's origin.
    pub audience: Origin,
    /// Issue time, seconds.
    pub iat: i64,
    /// Expiry, seconds.
    pub exp: i64,
    /// Every claim as received (including extras such as `jti`).
    pub all: Object,
}

/// Why a request JWT was refused (`invalid_token`; the client's fault).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// Not three canonical base64url parts, or too long.
    #[error("malformed compact JWS")]
    Malformed,
    /// Header or claims are not strict JSON of the required shape.
    #[error("malformed JWT {0}")]
    Shape(String),
    /// `alg` is not `EdDSA`, or `typ` is not `JWT`.
    #[error("unsupported JWT algorithm or type")]
    Algorithm,
    /// `kid`, `iss` and `sub` are not the same Agent ID.
    #[error("kid, iss and sub must be the same Agent ID")]
    Subject,
    /// The signature does not verify under `kid`.
    #[error("JWT signature does not verify")]
    Signature,
    /// `aud` is not this service's origin.
    #[error("JWT audience is not this service")]
    Audience,
    /// `exp <= iat`, the lifetime is too long, `iat` is in the future, or the token expired.
    #[error("JWT lifetime is invalid or outside the allowed window")]
    Lifetime,
}

/// Signs a request JWT for `audience` valid from `iat` to `exp` (seconds), with an optional `jti`.
pub fn sign_request_jwt(key: &SigningKey, audience: &Origin, iat: i64, exp: i64, jti: Option<&str>) -> String {
    let id = AgentId::of(key).to_string();
    let header = Object::new().with("alg", "EdDSA").with("typ", "JWT").with("kid", id.as_str());
    let mut claims = Object::new()
        .with("iss", id.as_str())
        .with("sub", id.as_str())
        .with("aud", audience.as_str())
        .with("iat", iat)
        .with("exp", exp);
    if let Some(jti) = jti {
        claims.insert("jti", Value::from(jti));
    }
    // Member order as written (JWS signs the exact bytes; no canonicalization is implied).
    let enc = |o: Object| b64(serde_json::to_string(&Value::Object(o)).unwrap_or_default().as_bytes());
    let signing_input = format!("{}.{}", enc(header), enc(claims));
    let sig = sign(key, signing_input.as_bytes());
    format!("{signing_input}.{}", b64(&sig))
}

/// Verifies a request JWT for the service at `audience` at `now_secs` (§7 steps 1–6).
pub fn verify_request_jwt(
    token: &str,
    audience: &Origin,
    now_secs: i64,
    policy: JwtPolicy,
) -> Result<RequestClaims, JwtError> {
    if token.len() > MAX_TOKEN_LEN {
        return Err(JwtError::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(h), Some(p), Some(s), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(JwtError::Malformed);
    };
    let header_bytes = b64_decode(h).ok_or(JwtError::Malformed)?;
    let claims_bytes = b64_decode(p).ok_or(JwtError::Malformed)?;
    let signature = b64_array::<64>(s).ok_or(JwtError::Malformed)?;

    let header = json::parse(&header_bytes).map_err(|e| JwtError::Shape(format!("header: {e}")))?;
    let header = shape::object(&header, "header").map_err(|e| JwtError::Shape(e.to_string()))?;
    shape::closed(header, "header", &["alg", "kid"], &["typ"]).map_err(|e| JwtError::Shape(e.to_string()))?;
    let text =
        |o: &Object, k: &str| shape::string(o, "", k).map(str::to_owned).map_err(|e| JwtError::Shape(e.to_string()));
    // Step 1.
    if text(header, "alg")? != "EdDSA" || header.get("typ").is_some_and(|t| t.as_str() != Some("JWT")) {
        return Err(JwtError::Algorithm);
    }
    let claims = json::parse(&claims_bytes).map_err(|e| JwtError::Shape(format!("claims: {e}")))?;
    let claims = shape::object(&claims, "claims").map_err(|e| JwtError::Shape(e.to_string()))?.clone();
    // Step 2.
    let (kid, iss, sub) = (text(header, "kid")?, text(&claims, "iss")?, text(&claims, "sub")?);
    if kid != iss || iss != sub {
        return Err(JwtError::Subject);
    }
    // Step 3.
    let subject = AgentId::parse(&kid).map_err(|_| JwtError::Subject)?;
    // Step 4: the JWS signing input is the first two parts exactly as sent.
    let signing_input = token.get(..h.len() + 1 + p.len()).ok_or(JwtError::Malformed)?;
    verify_strict(subject.public_key(), signing_input.as_bytes(), &signature).map_err(|_| JwtError::Signature)?;
    // Step 5.
    if text(&claims, "aud")? != audience.as_str() {
        return Err(JwtError::Audience);
    }
    // Step 6.
    let num = |k: &str| shape::integer(&claims, "", k).map_err(|e| JwtError::Shape(e.to_string()));
    let (iat, exp) = (num("iat")?, num("exp")?);
    if exp <= iat
        || exp - iat > policy.max_lifetime_secs
        || iat > now_secs.saturating_add(policy.max_skew_secs)
        || exp <= now_secs
    {
        return Err(JwtError::Lifetime);
    }
    Ok(RequestClaims { subject, audience: audience.clone(), iat, exp, all: claims })
}
