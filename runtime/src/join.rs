//! The join string: where the head is, and how to trust it.
//!
//! `xp://HOST:PORT?token=SECRET&ca=SHA256HEX`: a peer connects to HOST:PORT, accepts
//! the head only if its certificate chains to a CA whose DER has that SHA-256
//! digest, and proves itself with the token.
//!
//! The token is a secret, so a join string never travels on a command line
//! (where `ps` shows it to every local user): programs read it from a file only
//! its owner can read ([`read_join_file`]), from [`JOIN_ENV`] or from standard
//! input. Its `Debug` leaves the token out.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The environment variable `xp-node join` reads the join string from.
pub const JOIN_ENV: &str = "XP_JOIN";

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
    /// Other heads of the cluster (standbys sharing one PostgreSQL store), as
    /// (host, UDP port): a connection goes to whichever of them leads.
    pub more_heads: Vec<(String, u16)>,
}

/// The most heads one join string may name.
pub const MAX_HEADS: usize = 8;

impl fmt::Debug for JoinString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a secret: never print it in logs.
        f.debug_struct("JoinString")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("more_heads", &self.more_heads)
            .field("ca_sha256", &hex::encode(self.ca_sha256))
            .finish_non_exhaustive()
    }
}

/// Why a join string could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JoinStringError {
    /// Not a URL at all.
    #[error("join string is not of the form xp://HOST:PORT?token=SECRET&ca=SHA256HEX")]
    NotAUrl(#[source] url::ParseError),
    /// Some part is missing or wrong.
    #[error("join string {part}: {reason}")]
    Invalid {
        /// Which part.
        part: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
}

/// Why a join file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum JoinFileError {
    /// The file could not be read.
    #[error("cannot read the join file {}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Group or others may read or write the file.
    #[error(
        "the join file {shown} holds the cluster secret but its mode is {mode:o}: run `chmod 600 {shown}`",
        shown = .path.display()
    )]
    TooOpen {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file does not hold a join string.
    #[error("the join file {} does not hold a valid join string", .path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: JoinStringError,
    },
}

/// Reads a join string from `path`, a file only its owner may read or write: a
/// file with any of the mode bits `0o077` set is refused, as `ssh` refuses a
/// private key others can read.
pub fn read_join_file(path: &Path) -> Result<JoinString, JoinFileError> {
    use std::os::unix::fs::PermissionsExt;
    let io_error = |source| JoinFileError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io_error)?;
    let mode = file.metadata().map_err(io_error)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(JoinFileError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, 8192), &mut text)
        .map_err(io_error)?;
    text.parse().map_err(|source| JoinFileError::Invalid {
        path: path.to_owned(),
        source,
    })
}

impl FromStr for JoinString {
    type Err = JoinStringError;

    /// `xp://HOST:PORT[,HOST:PORT...]?token=...&ca=...`: one head, or several
    /// sharing a store (at most [`MAX_HEADS`]).
    fn from_str(text: &str) -> Result<Self, JoinStringError> {
        let invalid = |part, reason| JoinStringError::Invalid { part, reason };
        if text.len() > 4096 {
            return Err(invalid("length", "is longer than 4096 bytes"));
        }
        let text = text.trim();
        // The url crate reads one authority: the other heads are split off first.
        let (first, more_heads) = match text.strip_prefix("xp://") {
            Some(rest) => {
                let end = rest.find(['?', '/', '#']).unwrap_or(rest.len());
                let mut heads = rest[..end].split(',');
                let first = heads.next().unwrap_or_default();
                let more: Vec<(String, u16)> = heads
                    .map(|head| host_and_port(&format!("xp://{head}")))
                    .collect::<Result<_, _>>()?;
                if more.len() >= MAX_HEADS {
                    return Err(invalid("host", "names more than 8 heads"));
                }
                (format!("xp://{first}{}", &rest[end..]), more)
            }
            None => (text.to_owned(), Vec::new()),
        };
        let url = url::Url::parse(&first).map_err(JoinStringError::NotAUrl)?;
        if url.scheme() != "xp" {
            return Err(invalid("scheme", "must be xp://"));
        }
        let (host, port) = host_and_port(&first)?;
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
            more_heads,
        })
    }
}

/// The host and port of `xp://HOST:PORT...`.
fn host_and_port(text: &str) -> Result<(String, u16), JoinStringError> {
    let invalid = |part, reason| JoinStringError::Invalid { part, reason };
    let url = url::Url::parse(text).map_err(JoinStringError::NotAUrl)?;
    let host = url
        .host_str()
        .filter(|host| !host.is_empty())
        .ok_or(invalid("host", "is missing"))?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let port = url.port().ok_or(invalid("port", "is missing"))?;
    Ok((host, port))
}

impl JoinString {
    /// Every head it names, the first first.
    pub fn heads(&self) -> impl Iterator<Item = (&str, u16)> {
        std::iter::once((self.host.as_str(), self.port)).chain(
            self.more_heads
                .iter()
                .map(|(host, port)| (host.as_str(), *port)),
        )
    }
}

impl fmt::Display for JoinString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let heads: Vec<String> = self
            .heads()
            .map(|(host, port)| {
                if host.contains(':') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                }
            })
            .collect();
        write!(
            f,
            "xp://{}?token={}&ca={}",
            heads.join(","),
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
        let several = format!(
            "xp://h1:7700,[::1]:7701,h3:7702?token=t&ca={}",
            "00".repeat(32)
        );
        let heads: JoinString = several.parse().unwrap();
        assert_eq!(
            heads.heads().collect::<Vec<_>>(),
            [("h1", 7700), ("::1", 7701), ("h3", 7702)]
        );
        assert_eq!(heads.to_string(), several);
        for bad in [
            "http://h:1?token=t&ca=00".to_owned(),
            "xp://h?token=t".to_owned(),
            format!("xp://h:1?ca={}", "00".repeat(32)),
            "xp://h:1?token=t&ca=zz".to_owned(),
            format!("xp://h:1,h2?token=t&ca={}", "00".repeat(32)),
            format!("xp://h:1,?token=t&ca={}", "00".repeat(32)),
            format!(
                "xp://{}?token=t&ca={}",
                ["h:1"; 9].join(","),
                "00".repeat(32)
            ),
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

    fn check_join_file(mode: u32, expect_ok: bool) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("join");
        let text = format!("xp://h:1?token=secret&ca={}\n", "00".repeat(32));
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        match read_join_file(&path) {
            Ok(join) => {
                assert!(expect_ok, "mode {mode:o} was accepted");
                assert_eq!(join.token, "secret");
            }
            Err(error) => {
                assert!(!expect_ok, "mode {mode:o} was refused: {error}");
                assert!(error.to_string().contains("chmod 600"), "{error}");
            }
        }
    }

    #[test]
    fn a_join_file_others_can_read_is_refused() {
        check_join_file(0o600, true);
        check_join_file(0o400, true);
        check_join_file(0o700, true);
        check_join_file(0o640, false);
        check_join_file(0o604, false);
        check_join_file(0o644, false);
        check_join_file(0o620, false);
        check_join_file(0o601, false);
    }

    #[test]
    fn a_join_file_without_a_join_string_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("join");
        std::fs::write(&path, "not a join string").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let error = read_join_file(&path).unwrap_err();
        assert!(matches!(error, JoinFileError::Invalid { .. }), "{error}");
        let missing = read_join_file(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(missing, JoinFileError::Io { .. }), "{missing}");
    }
}
