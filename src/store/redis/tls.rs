//! PEM files for `rediss://` and the TLS settings the `redis` crate takes.

use ::redis::RedisError;

use crate::error::{ConfigError, TlsFileProblem};

/// PEM files for `rediss://` read at build time: a CA bundle replacing the built-in web roots,
/// and a client certificate with its key.
#[derive(Clone, Debug, Default)]
pub(super) struct TlsFiles {
    pub(super) ca: Option<Vec<u8>>,
    pub(super) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    pub(super) fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client.is_none()
    }

    pub(super) fn certificates(&self) -> ::redis::TlsCertificates {
        ::redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| ::redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        }
    }
}

/// Reads a PEM file for a TLS option, with the option and path in the error.
pub(super) fn read_pem(role: &'static str, path: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    let fail = |problem| ConfigError::TlsFile {
        role,
        path: path.to_owned(),
        problem,
    };
    let bytes = std::fs::read(path).map_err(|e| fail(TlsFileProblem::Unreadable(e.kind())))?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(fail(TlsFileProblem::NotPem));
    }
    Ok(bytes)
}

/// A `redis::Client` for one node URL, with the TLS files when given.
pub(super) fn client_for(url: &str, tls: &TlsFiles) -> Result<::redis::Client, RedisError> {
    if tls.is_empty() {
        ::redis::Client::open(url)
    } else {
        ::redis::Client::build_with_tls(url, tls.certificates())
    }
}

/// The TLS files as the `redis` crate takes them; `None` without any.
pub(super) fn certs(tls: &TlsFiles) -> Option<::redis::TlsCertificates> {
    (!tls.is_empty()).then(|| tls.certificates())
}
