//! What each wrong certificate or key file is called, as the proxy's
//! `ssl_certificate_key`, the checker's `--probe-client-key` and every other
//! user of [`certified_key`] report it.

use std::path::{Path, PathBuf};

use rcgen::{CertificateParams, KeyPair};

use super::*;
use crate::tls::client::ClientTls;

/// A passphrase-protected PKCS#8 key (`openssl pkcs8 -topk8 -passout pass:x`).
const ENCRYPTED_PKCS8: &str = "-----BEGIN ENCRYPTED PRIVATE KEY-----
MIHsMFcGCSqGSIb3DQEFDTBKMCkGCSqGSIb3DQEFDDAcBAjyhsp0RG8WVwICCAAw
DAYIKoZIhvcNAgkFADAdBglghkgBZQMEASoEEGOTVtedy256uDRowCqDs8gEgZCd
069rlxrMKm9aDr/twz6o7s+U6GpXg5pSJ1UphBwfmX8pVr+S0moWvng8ZTLVaIw+
x3aAELZcDUpZnJ67T2GNtU5mdPeydgOoKG2KkQBcoA5vG+lnPMd6knfQbp/8Ad3t
DYEkOk7PrVu4lqLcOLesbFKz8K0Fio7lzpb4mAGzGPrl0QEntPWj651Jr+uihT0=
-----END ENCRYPTED PRIVATE KEY-----
";

/// A legacy encrypted SEC1 key (`openssl ec -aes128 -passout pass:x`).
const ENCRYPTED_LEGACY: &str = "-----BEGIN EC PRIVATE KEY-----
Proc-Type: 4,ENCRYPTED
DEK-Info: AES-128-CBC,EB05F761C272FC33EB89715FEF46B033

Upx+PaPQ8KTuNjs0Kuy9kMl0umKAn81dCCgtrobSJMTV/if2WxNTD6WhCICcLzuJ
5+cvyRCRVFwMSfOebJix269LbmQSnf0sCqEnvSNQZ5zY5cqAM4QGeKUQuVD+/62l
00twgDc1nOasBj+zJrTzkIckieIB+bK8PA/WPJGcawE=
-----END EC PRIVATE KEY-----
";

/// A 1024-bit DSA key in PKCS#8 (`openssl dsaparam -genkey`, `pkcs8 -topk8 -nocrypt`).
const DSA_PKCS8: &str = "-----BEGIN PRIVATE KEY-----
MIIBWgIBADCCATMGByqGSM44BAEwggEmAoGBANG2fcPBW2oC+EPD9DLtCECTV4Eq
UyTxP0yh9XPc0YN6h8YrTf9+KlEppZwsa+aRWuXu/8bwDvGvn65+tyyjZayEORjN
HVBpLFmEdGOUfExMuo4JJzLeXUh2wjefWlPlJdHX1l0cACUbDZW+E6oq/SXVdbuL
v3s5yJE02neZSKzlAh0AwOqkKoDrlZy9sWJa6xZJvji/SyzECfNFCXwNSwKBgH34
64V42oFYE1hNsZGv432i31OZpYwpSR7GSGwoJ03DSG1tYtnslw1jJStkq1VMwmbS
IUTW7HQ/57sSU7/1wqZlqTmFkhBqjZBhocaOlH9nKFKS2QVEoVQ+sW+j3fHKAPU7
948BOPPKSYhLBrByIzKPSaENQm2bYe+vBuZtg2WKBB4CHHWi+jed/tTfjCFffW7C
OYgOB6Du7gxg+e9SR2A=
-----END PRIVATE KEY-----
";

/// The same DSA key in OpenSSL's traditional form (`openssl pkey -traditional`).
const DSA_TRADITIONAL: &str = "-----BEGIN DSA PRIVATE KEY-----
MIIBywIBAAKBgQDRtn3DwVtqAvhDw/Qy7QhAk1eBKlMk8T9MofVz3NGDeofGK03/
fipRKaWcLGvmkVrl7v/G8A7xr5+ufrcso2WshDkYzR1QaSxZhHRjlHxMTLqOCScy
3l1IdsI3n1pT5SXR19ZdHAAlGw2VvhOqKv0l1XW7i797OciRNNp3mUis5QIdAMDq
pCqA65WcvbFiWusWSb44v0ssxAnzRQl8DUsCgYB9+OuFeNqBWBNYTbGRr+N9ot9T
maWMKUkexkhsKCdNw0htbWLZ7JcNYyUrZKtVTMJm0iFE1ux0P+e7ElO/9cKmZak5
hZIQao2QYaHGjpR/ZyhSktkFRKFUPrFvo93xygD1O/ePATjzykmISwawciMyj0mh
DUJtm2HvrwbmbYNligKBgQCt15ju/witLZ9HmqRu1JTd51rFVEa69cMKY/cQC2fT
1z/z7Nwfw1LZ5rlzkjIVMHZ4+vorASTe9FiU5V2v77o1JYmr0U7AljTSyooSYsQ1
3QZlsnGSfQ7K+2BLl+8GjLALdZQpIaa8h/HZYTFrLHSaawzsse/wko4vNHQz5Sud
+wIcdaL6N53+1N+MIV99bsI5iA4HoO7uDGD571JHYA==
-----END DSA PRIVATE KEY-----
";

/// An OpenSSH key's envelope (its contents do not matter: the label is read).
const OPENSSH: &str = "-----BEGIN OPENSSH PRIVATE KEY-----
b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW
-----END OPENSSH PRIVATE KEY-----
";

/// A self-signed certificate for `name` and its key (PKCS#8), written to `dir`.
fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let key = KeyPair::generate().expect("key");
    let cert = CertificateParams::new(vec![name.to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, cert.pem()).expect("write");
    std::fs::write(&k, key.serialize_pem()).expect("write");
    (c, k)
}

#[test]
fn each_wrong_file_is_named_with_what_it_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (ca, ka) = pair(d, "a.test");
    let (cb, _) = pair(d, "b.test");
    let file = |name: &str, text: &[u8]| {
        let p = d.join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    let empty = file("empty.pem", b"");
    let blank = file("blank.pem", b"\n \n");
    let der = file("key.der", &[0x30, 0x82, 0x01, 0x22, 0x02, 0x01]);
    let bundle = {
        let mut both = std::fs::read(&cb).expect("read");
        both.extend(std::fs::read(&ka).expect("read"));
        file("bundle.pem", &both)
    };
    // The chain in the wrong order: another certificate before the server's own.
    let reversed = {
        let mut both = std::fs::read(&cb).expect("read");
        both.extend(std::fs::read(&ca).expect("read"));
        file("reversed.crt", &both)
    };
    let cases: Vec<(&str, PathBuf, PathBuf, String)> = vec![
        (
            "key of another certificate",
            ca.clone(),
            d.join("b.test.key"),
            format!(
                "{}: the key does not match the certificate {} (the server's own certificate must come first in that file, before its chain)",
                d.join("b.test.key").display(),
                ca.display()
            ),
        ),
        (
            "chain in the wrong order",
            reversed.clone(),
            ka.clone(),
            format!(
                "{}: the key does not match the certificate {} (the server's own certificate must come first in that file, before its chain)",
                ka.display(),
                reversed.display()
            ),
        ),
        (
            "a certificate given as the key",
            ca.clone(),
            ca.clone(),
            format!("{}: no private key found (the file holds a CERTIFICATE block)", ca.display()),
        ),
        (
            "encrypted PKCS#8 key",
            ca.clone(),
            file("enc8.key", ENCRYPTED_PKCS8.as_bytes()),
            format!(
                "{}: the key is encrypted (a passphrase-protected PEM key); vigil reads unencrypted keys only (nginx's ssl_password_file is not supported): `openssl pkey -in KEY -out PLAIN` writes one",
                d.join("enc8.key").display()
            ),
        ),
        (
            "encrypted legacy key",
            ca.clone(),
            file("enc.key", ENCRYPTED_LEGACY.as_bytes()),
            format!(
                "{}: the key is encrypted (a passphrase-protected PEM key); vigil reads unencrypted keys only (nginx's ssl_password_file is not supported): `openssl pkey -in KEY -out PLAIN` writes one",
                d.join("enc.key").display()
            ),
        ),
        (
            "empty key file",
            ca.clone(),
            empty.clone(),
            format!("{}: no private key found (the file is empty)", empty.display()),
        ),
        (
            "blank key file",
            ca.clone(),
            blank.clone(),
            format!("{}: no private key found (the file is empty)", blank.display()),
        ),
        (
            "DSA key, traditional form",
            ca.clone(),
            file("dsa.key", DSA_TRADITIONAL.as_bytes()),
            format!(
                "{}: a DSA key is not supported; use RSA (2048 to 8192 bits), ECDSA P-256 or P-384, or Ed25519",
                d.join("dsa.key").display()
            ),
        ),
        (
            "OpenSSH key",
            ca.clone(),
            file("ssh.key", OPENSSH.as_bytes()),
            format!(
                "{}: OPENSSH PRIVATE KEY is not a key format vigil reads (PEM PKCS#8 (PRIVATE KEY), PKCS#1 (RSA PRIVATE KEY) or SEC1 (EC PRIVATE KEY))",
                d.join("ssh.key").display()
            ),
        ),
        (
            "DER key",
            ca.clone(),
            der.clone(),
            format!(
                "{}: no private key found (the file holds no PEM block: vigil reads PEM, not DER (`openssl x509 -inform DER` or `openssl pkey -inform DER` converts))",
                der.display()
            ),
        ),
        (
            "a key given as the certificate",
            ka.clone(),
            ka.clone(),
            format!("{}: no certificate found (the file holds a PRIVATE KEY block)", ka.display()),
        ),
        (
            "empty certificate file",
            empty.clone(),
            ka.clone(),
            format!("{}: no certificate found (the file is empty)", empty.display()),
        ),
        (
            "one file holding another certificate and this key",
            bundle.clone(),
            bundle.clone(),
            format!(
                "{}: the key does not match the certificate {} (the server's own certificate must come first in that file, before its chain)",
                bundle.display(),
                bundle.display()
            ),
        ),
    ];
    for (what, cert, key, expected) in cases {
        let server = crate::tls::server::load_key(&cert, &key)
            .map(drop)
            .map_err(|e| e.to_string());
        assert_eq!(server, Err(expected.clone()), "server: {what}");
        let client = ClientTls {
            verify: false,
            ca_file: None,
            client_auth: Some((&cert, &key)),
        }
        .build()
        .map(drop)
        .map_err(|e| e.to_string());
        assert_eq!(client, Err(expected), "client: {what}");
    }
}

#[test]
fn a_key_rustls_cannot_sign_with_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, _) = pair(dir.path(), "a.test");
    let key = dir.path().join("dsa8.key");
    std::fs::write(&key, DSA_PKCS8).expect("write");
    let e = certified_key(&ca, &key)
        .map(drop)
        .map_err(|e| e.to_string());
    let e = e.expect_err("a DSA key cannot sign");
    assert_eq!(
        e,
        format!(
            "{}: the key cannot be used (failed to parse private key as RSA, ECDSA, or EdDSA); use RSA (2048 to 8192 bits), ECDSA P-256 or P-384, or Ed25519",
            key.display()
        )
    );
}

#[test]
fn a_matching_pair_loads_and_a_bundle_serves_as_both() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ca, ka) = pair(dir.path(), "a.test");
    assert!(certified_key(&ca, &ka).is_ok());
    // nginx takes one file for both directives; so does vigil.
    let mut both = std::fs::read(&ca).expect("read");
    both.extend(std::fs::read(&ka).expect("read"));
    let bundle = dir.path().join("bundle.pem");
    std::fs::write(&bundle, both).expect("write");
    assert!(certified_key(&bundle, &bundle).is_ok());
    assert!(ClientTls {
        verify: false,
        ca_file: None,
        client_auth: Some((&ca, &ka)),
    }
    .build()
    .is_ok());
}
