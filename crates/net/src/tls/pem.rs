//! Certificate and key files (PEM), read once for every TLS user: the
//! proxy's `ssl_certificate` / `ssl_certificate_key`, the checker's and
//! upstreams' client certificates. When a file does not hold what it
//! should, the error says what it holds instead (an empty file, a
//! `CERTIFICATE` block where a key was wanted, an encrypted or DSA key, no
//! PEM at all), so the operator does not have to guess from "no items found".

use std::path::Path;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::{provider, read, TlsError};

/// The key formats vigil reads, for messages.
const KEY_FORMATS: &str =
    "PEM PKCS#8 (PRIVATE KEY), PKCS#1 (RSA PRIVATE KEY) or SEC1 (EC PRIVATE KEY)";
/// The key types rustls (ring) signs with, for messages.
const KEY_TYPES: &str = "RSA (2048 to 8192 bits), ECDSA P-256 or P-384, or Ed25519";

/// The PEM certificates of `path`, at least one.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::file(path, unreadable(&e)))?;
    if certs.is_empty() {
        return Err(TlsError::file(
            path,
            format!("no certificate found ({})", holds(&pem)),
        ));
    }
    Ok(certs)
}

/// The first private key of `path` (PEM).
pub fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read(path)?;
    let labels = labels(&pem);
    // A legacy encrypted PEM key ("Proc-Type: 4,ENCRYPTED" inside an RSA
    // or EC block) parses as a key block with headers; say what it is first.
    if labels.iter().any(|l| l == "ENCRYPTED PRIVATE KEY")
        || has_line(&pem, "Proc-Type: 4,ENCRYPTED")
    {
        return Err(TlsError::file(
            path,
            "the key is encrypted (a passphrase-protected PEM key); vigil reads unencrypted keys only \
             (nginx's ssl_password_file is not supported): `openssl pkey -in KEY -out PLAIN` writes one",
        ));
    }
    match PrivateKeyDer::from_pem_slice(&pem) {
        Ok(key) => Ok(key),
        Err(pem::Error::NoItemsFound) => {
            let message = match labels.iter().find(|l| l.ends_with("PRIVATE KEY")) {
                Some(l) if l == "DSA PRIVATE KEY" => {
                    format!("a DSA key is not supported; use {KEY_TYPES}")
                }
                Some(l) => format!("{l} is not a key format vigil reads ({KEY_FORMATS})"),
                None => format!("no private key found ({})", holds(&pem)),
            };
            Err(TlsError::file(path, message))
        }
        Err(e) => Err(TlsError::file(path, unreadable(&e))),
    }
}

/// The chain of `cert` and the key of `key`, checked to belong together:
/// the key must be one rustls can sign with, and its public half the first
/// certificate's.
pub fn certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = read_certs(cert)?;
    let der = read_key(key)?;
    let signing = provider().key_provider.load_private_key(der).map_err(|e| {
        // ring's refusal is a General error ("unexpected error: ..."): its text alone.
        let why = match e {
            rustls::Error::General(why) => why,
            e => e.to_string(),
        };
        TlsError::file(
            key,
            format!("the key cannot be used ({why}); use {KEY_TYPES}"),
        )
    })?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        // A key that cannot tell its public half is let through, as rustls does.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
            Ok(certified)
        }
        Err(rustls::Error::InconsistentKeys(_)) => Err(TlsError::file(
            key,
            format!(
                "the key does not match the certificate {} (the server's own certificate must come first in that file, before its chain)",
                cert.display()
            ),
        )),
        Err(e) => Err(TlsError::file(
            cert,
            format!("the first certificate cannot be parsed ({e})"),
        )),
    }
}

/// "the file is empty", "the file holds a CERTIFICATE block", ...
fn holds(pem: &[u8]) -> String {
    if pem.iter().all(u8::is_ascii_whitespace) {
        return "the file is empty".into();
    }
    let labels = labels(pem);
    match labels.as_slice() {
        [] => "the file holds no PEM block: vigil reads PEM, not DER (`openssl x509 -inform DER` or `openssl pkey -inform DER` converts)".into(),
        [one] => format!("the file holds a {one} block"),
        many => format!("the file holds {} blocks", many.join(", ")),
    }
}

fn unreadable(e: &pem::Error) -> String {
    format!("the file is not valid PEM ({e})")
}

/// The labels of the file's `-----BEGIN LABEL-----` lines, each once, in order.
fn labels(pem: &[u8]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in pem.split(|b| *b == b'\n' || *b == b'\r') {
        let label = line
            .trim_ascii()
            .strip_prefix(b"-----BEGIN ")
            .and_then(|l| l.strip_suffix(b"-----"))
            // Quoted in messages: printable ASCII and short only.
            .filter(|l| l.len() <= 64 && l.iter().all(|b| b.is_ascii_graphic() || *b == b' '));
        if let Some(l) = label.and_then(|l| std::str::from_utf8(l).ok()) {
            if !out.iter().any(|o| o == l) {
                out.push(l.to_string());
            }
        }
    }
    out
}

fn has_line(pem: &[u8], want: &str) -> bool {
    pem.split(|b| *b == b'\n' || *b == b'\r')
        .any(|l| l.trim_ascii() == want.as_bytes())
}

#[cfg(test)]
mod tests;
