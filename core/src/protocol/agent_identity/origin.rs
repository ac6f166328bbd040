//! Serialized HTTPS origins (§4.4): a string is valid exactly when parsing it as a WHATWG URL and
//! serializing that URL's origin gives the same string back.
//!
//! Implemented without a URL library (this code must build without the `runtime` feature):
//! IPv4 hosts must be canonical dotted decimal (a host whose last label is numeric is an IPv4
//! address to WHATWG, so `https://127.1` is refused), IPv6 hosts must be in WHATWG's compressed
//! lower-case form, ports must be canonical decimal and not 443. Domain labels are limited to
//! lower-case `a-z 0-9 - _`; `xn--` labels must be valid Punycode that decodes to a non-ASCII
//! label without control, space or upper-case characters. Deliberately stricter than WHATWG on
//! rare forms (empty labels, a trailing dot, exotic ASCII punctuation); the one known gap is the
//! finer Unicode validity of a decoded `xn--` label (UTS #46 mapping, NFC, bidi), not checked.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Longest origin accepted (bounds the work done on untrusted input).
pub const MAX_ORIGIN_LEN: usize = 1024;

/// A valid serialized HTTPS origin, e.g. `https://relay.example` or `https://[::1]:8443`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Origin(String);

/// Why a string is not a serialized HTTPS origin (the peer's or the configuration's fault).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OriginError {
    /// Longer than [`MAX_ORIGIN_LEN`].
    #[error("origin is too long")]
    TooLong,
    /// Does not start with `https://`.
    #[error("origin is not https")]
    NotHttps,
    /// Has userinfo, a path, query, fragment, whitespace or percent-encoding.
    #[error("origin has components beyond scheme, host and port")]
    NotBareOrigin,
    /// The host is empty or not in canonical form.
    #[error("origin host is not canonical")]
    Host,
    /// The port is empty, non-canonical, out of range or the default 443.
    #[error("origin port is not canonical")]
    Port,
}

impl Origin {
    /// Validates `text` as a serialized HTTPS origin.
    pub fn parse(text: &str) -> Result<Self, OriginError> {
        if text.len() > MAX_ORIGIN_LEN {
            return Err(OriginError::TooLong);
        }
        let rest = text.strip_prefix("https://").ok_or(OriginError::NotHttps)?;
        if rest.bytes().any(|b| matches!(b, b'/' | b'?' | b'#' | b'@' | b'\\' | b'%') || !b.is_ascii_graphic()) {
            return Err(OriginError::NotBareOrigin);
        }
        let (host, port) = if rest.starts_with('[') {
            let close = rest.find(']').ok_or(OriginError::Host)?;
            let (host, after) = rest.split_at(close + 1);
            match after {
                "" => (host, None),
                _ => (host, Some(after.strip_prefix(':').ok_or(OriginError::Host)?)),
            }
        } else {
            match rest.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (rest, None),
            }
        };
        if let Some(port) = port {
            check_port(port)?;
        }
        check_host(host)?;
        Ok(Self(text.to_owned()))
    }

    /// The origin string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Origin({})", self.0)
    }
}

fn check_port(port: &str) -> Result<(), OriginError> {
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) || (port.len() > 1 && port.starts_with('0')) {
        return Err(OriginError::Port);
    }
    match port.parse::<u16>() {
        Ok(443) | Err(_) => Err(OriginError::Port),
        Ok(_) => Ok(()),
    }
}

fn check_host(host: &str) -> Result<(), OriginError> {
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        let addr: Ipv6Addr = inner.parse().map_err(|_| OriginError::Host)?;
        return if serialize_ipv6(&addr) == inner { Ok(()) } else { Err(OriginError::Host) };
    }
    if host.is_empty() {
        return Err(OriginError::Host);
    }
    let labels: Vec<&str> = host.split('.').collect();
    for label in &labels {
        if label.is_empty() || !label.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_')) {
            return Err(OriginError::Host);
        }
        if let Some(encoded) = label.strip_prefix("xn--") {
            let decoded = punycode_decode(encoded).ok_or(OriginError::Host)?;
            // UTS #46 would refuse an all-ASCII A-label and any control, space or upper-case
            // code point; finer validity (mapping, NFC, bidi) is not checked here.
            if decoded.iter().all(char::is_ascii)
                || decoded.iter().any(|c| c.is_control() || c.is_whitespace() || c.is_uppercase())
            {
                return Err(OriginError::Host);
            }
        }
    }
    // WHATWG parses a host whose last label is a number as IPv4 and reserializes it.
    let last = labels.last().copied().unwrap_or_default();
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || last.strip_prefix("0x").is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    if numeric {
        let addr: Ipv4Addr = host.parse().map_err(|_| OriginError::Host)?;
        if addr.to_string() != host {
            return Err(OriginError::Host);
        }
    }
    Ok(())
}

/// WHATWG's IPv6 serializer: lower-case hex, the first longest run of two or more zero pieces
/// compressed to `::`, no embedded IPv4 notation.
fn serialize_ipv6(addr: &Ipv6Addr) -> String {
    let pieces = addr.segments();
    // Find the first longest run of zeros of length >= 2.
    let (mut best_start, mut best_len) = (None, 1usize);
    let mut i = 0;
    while i < pieces.len() {
        if pieces.get(i) == Some(&0) {
            let start = i;
            while pieces.get(i) == Some(&0) {
                i += 1;
            }
            if i - start > best_len {
                best_start = Some(start);
                best_len = i - start;
            }
        } else {
            i += 1;
        }
    }
    let mut out = String::new();
    let mut ignore0 = false;
    for (index, piece) in pieces.iter().enumerate() {
        if ignore0 && *piece == 0 {
            continue;
        }
        ignore0 = false;
        if best_start == Some(index) {
            out.push_str(if index == 0 { "::" } else { ":" });
            ignore0 = true;
            continue;
        }
        out.push_str(&format!("{piece:x}"));
        if index != 7 {
            out.push(':');
        }
    }
    out
}

/// RFC 3492 Punycode decoding of the part after `xn--`; `None` when it is malformed.
fn punycode_decode(input: &str) -> Option<Vec<char>> {
    const BASE: u32 = 36;
    const T_MIN: u32 = 1;
    const T_MAX: u32 = 26;
    const SKEW: u32 = 38;
    const DAMP: u32 = 700;
    const INITIAL_BIAS: u32 = 72;
    const INITIAL_N: u32 = 128;

    fn adapt(mut delta: u32, num_points: u32, first: bool) -> u32 {
        delta /= if first { DAMP } else { 2 };
        delta += delta / num_points;
        let mut k = 0;
        while delta > ((BASE - T_MIN) * T_MAX) / 2 {
            delta /= BASE - T_MIN;
            k += BASE;
        }
        k + (((BASE - T_MIN + 1) * delta) / (delta + SKEW))
    }

    let (basic, extended) = match input.rfind('-') {
        Some(at) => (input.get(..at)?, input.get(at + 1..)?),
        None => ("", input),
    };
    let mut output: Vec<char> = basic.chars().collect();
    if extended.is_empty() {
        return None;
    }
    let (mut n, mut i, mut bias) = (INITIAL_N, 0u32, INITIAL_BIAS);
    let mut digits = extended.bytes().peekable();
    while digits.peek().is_some() {
        let old_i = i;
        let mut w = 1u32;
        let mut k = BASE;
        loop {
            let byte = digits.next()?;
            let digit = match byte {
                b'a'..=b'z' => u32::from(byte - b'a'),
                b'0'..=b'9' => u32::from(byte - b'0') + 26,
                _ => return None,
            };
            i = i.checked_add(digit.checked_mul(w)?)?;
            let t = if k <= bias {
                T_MIN
            } else if k >= bias + T_MAX {
                T_MAX
            } else {
                k - bias
            };
            if digit < t {
                break;
            }
            w = w.checked_mul(BASE - t)?;
            k += BASE;
        }
        let len = u32::try_from(output.len()).ok()?.checked_add(1)?;
        bias = adapt(i - old_i, len, old_i == 0);
        n = n.checked_add(i / len)?;
        i %= len;
        let c = char::from_u32(n)?;
        output.insert(usize::try_from(i).ok()?, c);
        i += 1;
    }
    Some(output)
}

/// Writes `?route=a&route=b…` for `routes`, the query both Agent URLs and mail addresses carry.
pub fn write_route_query(f: &mut fmt::Formatter<'_>, routes: &[Origin]) -> fmt::Result {
    for (i, route) in routes.iter().enumerate() {
        f.write_str(if i == 0 { "?route=" } else { "&route=" })?;
        f.write_str(route.as_str())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_serialization_matches_whatwg() {
        for (input, out) in [
            ("::1", "::1"),
            ("2001:db8::1", "2001:db8::1"),
            ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),
            ("::ffff:1.2.3.4", "::ffff:102:304"),
            ("1:0:0:0:0:0:0:0", "1::"),
            ("1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8"),
            ("1:0:2:3:4:5:6:7", "1:0:2:3:4:5:6:7"),
        ] {
            assert_eq!(serialize_ipv6(&input.parse().unwrap()), out, "{input}");
        }
    }

    #[test]
    fn punycode_decodes_greek() {
        let decoded: String = punycode_decode("nxasmq6b").unwrap().into_iter().collect();
        assert_eq!(decoded, "βόλοσ");
        assert!(punycode_decode("").is_none());
        assert!(punycode_decode("9999999999999").is_none());
    }

    #[test]
    fn hosts_and_ports_must_round_trip() {
        for ok in ["https://a.example", "https://a.example:1", "https://[2001:db8::1]:8443", "https://1.2.3.4"] {
            assert!(Origin::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "https://a.example:",
            "https://a.example:65536",
            "https://[2001:DB8::1]",
            "https://[::1]x",
            "https://1.2.3.256",
            "https://0x7f.0.0.1",
            "https://a..example",
            "https://a.example.",
            "https://xn--a.example",
            "https://xn--.example",
            "https://xn--9999999999999.example",
            "https://a b",
            "https://a.example:4 43",
        ] {
            assert!(Origin::parse(bad).is_err(), "{bad}");
        }
    }
}
