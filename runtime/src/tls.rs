//! The cluster's trust material: a CA, the head's certificate, and the token.
//!
//! The head creates them once in its data directory and reuses them on every
//! start, so join strings stay valid across restarts. Peers pin the CA by the
//! SHA-256 of its DER; the head's certificate names `xp-head`, whatever address
//! it is reached at.
//!
//! It also holds the one certificate verifier of every QUIC client in xp,
//! [`PinnedVerifier`]: the control plane pins the head's CA
//! ([`Pin::Ca`]); collective links and object links pin a self-signed leaf
//! ([`Pin::Leaf`]). Building TLS and QUIC configurations around it is
//! `crate::transport`'s job, not this module's.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// The server name the head's certificate carries.
pub const HEAD_SERVER_NAME: &str = "xp-head";

/// Why trust material could not be loaded or created.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("cannot access {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Certificate generation failed.
    #[error("cannot generate certificates: {0}")]
    Generate(#[from] rcgen::Error),
    /// A stored file is not what it should be.
    #[error("{path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// The head's trust material.
pub struct ClusterIdentity {
    /// The CA certificate (DER).
    pub ca_der: CertificateDer<'static>,
    /// The head's leaf certificate (DER), signed by the CA.
    pub server_der: CertificateDer<'static>,
    /// The leaf's private key (PKCS#8 DER).
    pub server_key: PrivatePkcs8KeyDer<'static>,
    /// The cluster secret.
    pub token: String,
}

impl fmt::Debug for ClusterIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterIdentity")
            .field("ca_sha256", &hex::encode(self.ca_sha256()))
            .finish_non_exhaustive()
    }
}

fn read_file(path: &Path) -> Result<Option<Vec<u8>>, TlsError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TlsError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

/// Writes `bytes` to `path` atomically (temporary file, fsync, rename) with mode 0600.
pub fn write_private_file(path: &Path, bytes: &[u8]) -> Result<(), TlsError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let io_error = |source| TlsError::Io {
        path: path.display().to_string(),
        source,
    };
    let temporary = path.with_extension("tmp");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(io_error)?;
    file.write_all(bytes).map_err(io_error)?;
    file.sync_all().map_err(io_error)?;
    std::fs::rename(&temporary, path).map_err(io_error)
}

/// Makes `dir` a directory only its owner may enter (mode 0700): creates it (and
/// any missing parent) with that mode, or tightens an existing one. Returns the
/// previous mode when an existing directory was tightened, so the caller can
/// warn that it was open to others.
pub fn create_private_dir(dir: &Path) -> std::io::Result<Option<u32>> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    restrict_mode(dir, 0o700)
}

/// Tightens an existing file holding a secret or user data to mode 0600. Returns
/// the previous mode when it was open to group or others; `None` when it was
/// private already or does not exist.
pub fn make_file_private(path: &Path) -> std::io::Result<Option<u32>> {
    match std::fs::symlink_metadata(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
        Ok(_) => restrict_mode(path, 0o600),
    }
}

fn restrict_mode(path: &Path, private_mode: u32) -> std::io::Result<Option<u32>> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o7777;
    if mode & 0o077 == 0 {
        return Ok(None);
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(private_mode))?;
    Ok(Some(mode))
}

impl ClusterIdentity {
    /// The files of an identity in `dir`, all mode 0600: the CA certificate, the
    /// head's certificate, its private key and the token.
    pub const FILES: [&'static str; 4] = ["ca.der", "server.der", "server.key", "token"];

    /// Loads the identity from `dir`, creating it on first use.
    pub fn load_or_create(dir: &Path) -> Result<Self, TlsError> {
        let paths = Self::FILES.map(|name| dir.join(name));
        let loaded = paths
            .iter()
            .map(|path| read_file(path))
            .collect::<Result<Vec<_>, _>>()?;
        match loaded.as_slice() {
            [Some(ca), Some(server), Some(key), Some(token)] => {
                let token = String::from_utf8(token.clone())
                    .ok()
                    .filter(|token| token.len() == 64 && token.chars().all(|ch| ch.is_ascii_hexdigit()))
                    .ok_or_else(|| TlsError::Corrupt {
                        path: paths[3].display().to_string(),
                        reason: "not a 64-digit hex token".to_owned(),
                    })?;
                Ok(Self {
                    ca_der: CertificateDer::from(ca.clone()),
                    server_der: CertificateDer::from(server.clone()),
                    server_key: PrivatePkcs8KeyDer::from(key.clone()),
                    token,
                })
            }
            [None, None, None, None] => {
                create_private_dir(dir)
                    .map_err(|source| TlsError::Io { path: dir.display().to_string(), source })?;
                let identity = Self::generate()?;
                // The token is written last: its presence marks a complete identity.
                write_private_file(&paths[0], &identity.ca_der)?;
                write_private_file(&paths[1], &identity.server_der)?;
                write_private_file(&paths[2], identity.server_key.secret_pkcs8_der())?;
                write_private_file(&paths[3], identity.token.as_bytes())?;
                Ok(identity)
            }
            _ => Err(TlsError::Corrupt {
                path: dir.display().to_string(),
                reason: "some of ca.der, server.der, server.key and token are missing; restore them or start with an empty directory".to_owned(),
            }),
        }
    }

    fn generate() -> Result<Self, TlsError> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "xp cluster CA");
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;

        let server_key = rcgen::KeyPair::generate()?;
        let mut server_params = rcgen::CertificateParams::new(vec![HEAD_SERVER_NAME.to_owned()])?;
        server_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, HEAD_SERVER_NAME);
        let server_cert = server_params.signed_by(&server_key, &ca)?;

        let mut secret = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret).map_err(
            |_| TlsError::Corrupt {
                path: "system random".to_owned(),
                reason: "no entropy".to_owned(),
            },
        )?;
        Ok(Self {
            ca_der: ca.der().clone(),
            server_der: server_cert.der().clone(),
            server_key: PrivatePkcs8KeyDer::from(server_key.serialize_der()),
            token: hex::encode(secret),
        })
    }

    /// SHA-256 of the CA certificate: the `ca` of the join string.
    pub fn ca_sha256(&self) -> [u8; 32] {
        sha256(&self.ca_der)
    }

    /// Whether `presented` is this cluster's token, compared in constant time.
    pub fn token_matches(&self, presented: &str) -> bool {
        // blake3::Hash equality is constant-time.
        blake3::hash(presented.as_bytes()) == blake3::hash(self.token.as_bytes())
    }

    /// The head's certificate chain and key, for the server config.
    pub fn server_chain(&self) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        (
            vec![self.server_der.clone(), self.ca_der.clone()],
            PrivateKeyDer::Pkcs8(self.server_key.clone_key()),
        )
    }
}

/// 256 bits from the operating system's secure generator, for secrets such as a
/// worker's pass to its node's object channel; `None` if the system has no entropy.
pub fn random_secret() -> Option<[u8; 32]> {
    let mut secret = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret).ok()?;
    Some(secret)
}

/// SHA-256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

/// What a [`PinnedVerifier`] trusts, by the SHA-256 of a certificate's DER.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// A CA: the server must send a certificate with this hash among its
    /// intermediates, and its leaf must chain to it (the head and the join
    /// string's `ca`).
    Ca([u8; 32]),
    /// The server's own self-signed certificate: its leaf must have this hash
    /// (collective links and object servers, whose hash travels with their address).
    Leaf([u8; 32]),
}

/// The head's chain holds no certificate with the CA hash the join string pins.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the head's CA does not match the join string: join string pins ca={}, head presented ca={}",
    hex::encode(.pinned),
    .presented.iter().map(hex::encode).collect::<Vec<_>>().join(",")
)]
pub struct CaMismatch {
    /// The hash the join string pins.
    pub pinned: [u8; 32],
    /// The hashes of the intermediates the head sent.
    pub presented: Vec<[u8; 32]>,
}

/// Accepts a server's certificate only if it matches a [`Pin`].
///
/// The cluster has no public PKI: a client learns a hash out of band (the join
/// string, rendezvous, the head) and trusts exactly what it names. With
/// [`Pin::Ca`] the verifier finds the pinned CA in the server's chain and lets
/// webpki verify the leaf against it, so the chain checks are the standard ones;
/// a missing CA is kept as a [`CaMismatch`] (see [`PinnedVerifier::ca_mismatch`])
/// so the caller can say exactly what was wrong. With [`Pin::Leaf`] the leaf's
/// hash is the whole identity check, and TLS 1.2 is refused. Either way the
/// handshake signature is then checked with the provider's algorithms, which
/// proves the server holds the certificate's key.
///
/// It does not check the server name of a leaf pin (the hash identifies the
/// server) and does no revocation checks (certificates are pinned, not issued).
#[derive(Debug)]
pub struct PinnedVerifier {
    pin: Pin,
    provider: Arc<rustls::crypto::CryptoProvider>,
    ca_mismatch: Mutex<Option<CaMismatch>>,
}

impl PinnedVerifier {
    /// A verifier trusting `pin`, checking signatures with `provider`'s algorithms.
    pub fn new(pin: Pin, provider: Arc<rustls::crypto::CryptoProvider>) -> Self {
        Self {
            pin,
            provider,
            ca_mismatch: Mutex::new(None),
        }
    }

    /// The provider whose signature algorithms it uses; client configurations
    /// built around this verifier use the same one.
    pub fn provider(&self) -> &Arc<rustls::crypto::CryptoProvider> {
        &self.provider
    }

    /// The last handshake's [`CaMismatch`], if a server's chain lacked the pinned
    /// CA: rustls reports only a general error, so callers read the details here.
    pub fn ca_mismatch(&self) -> Option<CaMismatch> {
        self.ca_mismatch
            .lock()
            .expect("verifier mismatch lock is never poisoned")
            .clone()
    }

    fn verify_chain_to_ca(
        &self,
        pinned: [u8; 32],
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(ca) = intermediates.iter().find(|cert| sha256(cert) == pinned) else {
            let mismatch = CaMismatch {
                pinned,
                presented: intermediates.iter().map(|cert| sha256(cert)).collect(),
            };
            let message = mismatch.to_string();
            *self
                .ca_mismatch
                .lock()
                .expect("verifier mismatch lock is never poisoned") = Some(mismatch);
            return Err(rustls::Error::General(message));
        };
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            self.provider.clone(),
        )
        .build()
        .map_err(|error| rustls::Error::General(error.to_string()))?;
        verifier.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
    }
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.pin {
            Pin::Ca(pinned) => self.verify_chain_to_ca(
                pinned,
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            ),
            Pin::Leaf(pinned) if sha256(end_entity) == pinned => {
                Ok(ServerCertVerified::assertion())
            }
            Pin::Leaf(_) => Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        match self.pin {
            Pin::Ca(_) => rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            ),
            // A leaf pin is used only where TLS 1.3 alone is offered.
            Pin::Leaf(_) => Err(rustls::Error::PeerIncompatible(
                rustls::PeerIncompatible::Tls12NotOffered,
            )),
        }
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A fixed moment inside every generated certificate's validity.
    fn now() -> UnixTime {
        UnixTime::since_unix_epoch(Duration::from_secs(1_780_000_000))
    }

    /// Whether a verifier pinning `pin` accepts `chain` (leaf first) for `name`.
    fn check_accepts(pin: Pin, chain: &[CertificateDer<'static>], name: &str) -> bool {
        let verifier = PinnedVerifier::new(pin, Arc::new(rustls::crypto::ring::default_provider()));
        let server_name = ServerName::try_from(name.to_owned()).unwrap();
        verifier
            .verify_server_cert(&chain[0], &chain[1..], &server_name, &[], now())
            .is_ok()
    }

    fn self_signed() -> CertificateDer<'static> {
        rcgen::generate_simple_self_signed(vec!["xp-collective".to_owned()])
            .unwrap()
            .cert
            .der()
            .clone()
    }

    #[test]
    fn a_ca_pin_accepts_the_head_chain_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let identity = ClusterIdentity::load_or_create(dir.path()).unwrap();
        let other_dir = tempfile::tempdir().unwrap();
        let other = ClusterIdentity::load_or_create(other_dir.path()).unwrap();
        let (chain, _) = identity.server_chain();
        let pin = Pin::Ca(identity.ca_sha256());
        assert!(check_accepts(pin, &chain, HEAD_SERVER_NAME));
        // The chain must name the head, and its leaf must be signed by the CA.
        assert!(!check_accepts(pin, &chain, "someone-else"));
        let forged = [other.server_der.clone(), identity.ca_der.clone()];
        assert!(!check_accepts(pin, &forged, HEAD_SERVER_NAME));
        // A pinned leaf hash is not a CA pin.
        assert!(!check_accepts(
            Pin::Ca(sha256(&chain[0])),
            &chain,
            HEAD_SERVER_NAME
        ));
    }

    #[test]
    fn a_missing_ca_is_reported_with_both_hashes() {
        let dir = tempfile::tempdir().unwrap();
        let identity = ClusterIdentity::load_or_create(dir.path()).unwrap();
        let pinned = [7u8; 32];
        let verifier = PinnedVerifier::new(
            Pin::Ca(pinned),
            Arc::new(rustls::crypto::ring::default_provider()),
        );
        let server_name = ServerName::try_from(HEAD_SERVER_NAME).unwrap();
        let (chain, _) = identity.server_chain();
        assert!(verifier.ca_mismatch().is_none());
        let error = verifier
            .verify_server_cert(&chain[0], &chain[1..], &server_name, &[], now())
            .unwrap_err();
        let mismatch = verifier.ca_mismatch().unwrap();
        assert_eq!(
            mismatch,
            CaMismatch {
                pinned,
                presented: vec![identity.ca_sha256()],
            }
        );
        assert_eq!(error, rustls::Error::General(mismatch.to_string()));
        let message = mismatch.to_string();
        assert!(message.contains(&hex::encode(pinned)), "{message}");
        assert!(
            message.contains(&hex::encode(identity.ca_sha256())),
            "{message}"
        );
    }

    #[test]
    fn a_leaf_pin_accepts_only_the_certificate_with_its_hash() {
        let leaf = self_signed();
        let another = self_signed();
        assert!(check_accepts(
            Pin::Leaf(sha256(&leaf)),
            std::slice::from_ref(&leaf),
            "xp-collective"
        ));
        // The hash is the identity: the name is not checked.
        assert!(check_accepts(
            Pin::Leaf(sha256(&leaf)),
            std::slice::from_ref(&leaf),
            "anything"
        ));
        assert!(!check_accepts(
            Pin::Leaf(sha256(&another)),
            &[leaf],
            "xp-collective"
        ));
    }

    #[test]
    fn identity_is_created_once_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let first = ClusterIdentity::load_or_create(dir.path()).unwrap();
        let second = ClusterIdentity::load_or_create(dir.path()).unwrap();
        assert_eq!(first.ca_sha256(), second.ca_sha256());
        assert_eq!(first.token, second.token);
        assert!(first.token_matches(&first.token));
        assert!(!first.token_matches("wrong"));
    }

    fn mode_of(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn identity_files_and_private_dirs_are_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data").join("tls");
        ClusterIdentity::load_or_create(&dir).unwrap();
        assert_eq!(mode_of(&dir), 0o700);
        for name in ClusterIdentity::FILES {
            assert_eq!(mode_of(&dir.join(name)), 0o600, "{name}");
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(create_private_dir(&dir).unwrap(), Some(0o755));
        assert_eq!(create_private_dir(&dir).unwrap(), None);
        assert_eq!(mode_of(&dir), 0o700);
        let token = dir.join("token");
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(make_file_private(&token).unwrap(), Some(0o644));
        assert_eq!(make_file_private(&token).unwrap(), None);
        assert_eq!(mode_of(&token), 0o600);
        assert_eq!(make_file_private(&dir.join("missing")).unwrap(), None);
    }

    #[test]
    fn a_partial_identity_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        ClusterIdentity::load_or_create(dir.path()).unwrap();
        std::fs::remove_file(dir.path().join("server.key")).unwrap();
        assert!(matches!(
            ClusterIdentity::load_or_create(dir.path()),
            Err(TlsError::Corrupt { .. })
        ));
    }
}
