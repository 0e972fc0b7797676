//! The join string: where the head is, and how to trust it.
//!
//! `xp://HOST:PORT?token=SECRET&ca=SHA256HEX`: a peer connects to HOST:PORT, accepts
//! the head only if its certificate chains to a CA whose DER has that SHA-256
//! digest, and proves itself with the token.

use std::fmt;
use std::str::FromStr;

/// A parsed join string.
#[derive(Clone, PartialEq, Eq)]
pub struct JoinString {
    /// The head's host name or IP address.
    pub host: String,
    /// The head's UDP port.
    pub port: u16,
    /// The cluster secret.
    pub token: String,
    /// SHA-256 of the cluster CA certificate (DER).
    pub ca_sha256: [u8; 32],
}

impl fmt::Debug for JoinString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a secret: never print it in logs.
        f.debug_struct("JoinString")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("ca_sha256", &hex::encode(self.ca_sha256))
            .finish_non_exhaustive()
    }
}

/// Why a join string could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JoinStringError {
    /// Not a URL at all.
    #[error("join string is not of the form xp://HOST:PORT?token=SECRET&ca=SHA256HEX: {0}")]
    NotAUrl(String),
    /// Some part is missing or wrong.
    #[error("join string {part}: {reason}")]
    Invalid {
        /// Which part.
        part: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
}

impl FromStr for JoinString {
    type Err = JoinStringError;

    fn from_str(text: &str) -> Result<Self, JoinStringError> {
        let invalid = |part, reason| JoinStringError::Invalid { part, reason };
        if text.len() > 4096 {
            return Err(invalid("length", "is longer than 4096 bytes"));
        }
        let url = url::Url::parse(text.trim())
            .map_err(|error| JoinStringError::NotAUrl(error.to_string()))?;
        if url.scheme() != "xp" {
            return Err(invalid("scheme", "must be xp://"));
        }
        let host = url
            .host_str()
            .filter(|host| !host.is_empty())
            .ok_or(invalid("host", "is missing"))?;
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = url.port().ok_or(invalid("port", "is missing"))?;
        let mut token = None;
        let mut ca = None;
        for (key, value) in url.query_pairs() {
            match key.as_ref() {
                "token" => token = Some(value.into_owned()),
                "ca" => ca = Some(value.into_owned()),
                _ => return Err(invalid("query", "has a parameter other than token and ca")),
            }
        }
        let token = token
            .filter(|token| !token.is_empty())
            .ok_or(invalid("token", "is missing"))?;
        let ca = ca.ok_or(invalid("ca", "is missing"))?;
        let mut ca_sha256 = [0u8; 32];
        hex::decode_to_slice(&ca, &mut ca_sha256)
            .map_err(|_| invalid("ca", "must be 64 hex digits (a SHA-256)"))?;
        Ok(Self {
            host,
            port,
            token,
            ca_sha256,
        })
    }
}

impl fmt::Display for JoinString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        write!(
            f,
            "xp://{host}:{}?token={}&ca={}",
            self.port,
            self.token,
            hex::encode(self.ca_sha256)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_strings_round_trip_and_refuse_garbage() {
        let text = format!("xp://127.0.0.1:4100?token=abc123&ca={}", "ab".repeat(32));
        let join: JoinString = text.parse().unwrap();
        assert_eq!(join.port, 4100);
        assert_eq!(join.to_string(), text);
        let v6: JoinString = format!("xp://[::1]:9?token=t&ca={}", "00".repeat(32))
            .parse()
            .unwrap();
        assert_eq!(v6.host, "::1");
        assert_eq!(v6.to_string().parse::<JoinString>().unwrap(), v6);
        for bad in [
            "http://h:1?token=t&ca=00".to_owned(),
            "xp://h?token=t".to_owned(),
            format!("xp://h:1?ca={}", "00".repeat(32)),
            "xp://h:1?token=t&ca=zz".to_owned(),
            "not a url".to_owned(),
        ] {
            assert!(bad.parse::<JoinString>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn debug_hides_the_token() {
        let join: JoinString = format!("xp://h:1?token=secret&ca={}", "00".repeat(32))
            .parse()
            .unwrap();
        assert!(!format!("{join:?}").contains("secret"));
    }
}
