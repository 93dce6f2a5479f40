//! NBD over TLS (docs/tls.md): the server's credentials, and a connection that STARTTLS
//! turns into TLS.
//!
//! After the TLS handshake, a socket pair stands in for the client's socket: the rest of
//! the NBD handshake and the transmission phase run on one end as on any plain
//! connection (a reader thread, workers writing replies through clones, `poll` for
//! waiting input, `shutdown` at exit), while two pump threads move bytes between the
//! other end and the client's socket through the one rustls session: one decrypts what
//! the client sends, one encrypts what the server answers. The session's lock is never
//! held during a blocking read or write, so a client that is slow to read its replies
//! never stops its requests from being read.

use crate::server::Connection;
use parking_lot::{Mutex, MutexGuard};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes a pump moves per step: one TLS record's plaintext at most. With the socket
/// buffers this bounds what a connection holds in flight in each direction.
pub const TLS_PUMP_BUFFER_BYTES: usize = 16 << 10;

/// The certificate files, named as qemu's `tls-creds-x509` and nbdkit name them.
pub const SERVER_CERTIFICATE_FILE: &str = "server-cert.pem";
pub const SERVER_KEY_FILE: &str = "server-key.pem";
pub const CERTIFICATE_AUTHORITY_FILE: &str = "ca-cert.pem";

/// When TLS is used, as nbdkit's `--tls=off|on|require`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// STARTTLS is refused; the plain protocol is served.
    Off,
    /// STARTTLS is accepted; clients that do not ask for it are served in plain.
    On,
    /// Every option before STARTTLS is refused: nothing (not even the export names) is
    /// revealed and no data moves without TLS.
    Require,
}

impl TlsMode {
    pub fn name(self) -> &'static str {
        match self {
            TlsMode::Off => "off",
            TlsMode::On => "on",
            TlsMode::Require => "require",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("{}: {reason}", path.display())]
    File { path: PathBuf, reason: String },
    #[error("{}: no certificate in the file", path.display())]
    NoCertificate { path: PathBuf },
    #[error("the server's certificate and key: {0}")]
    Credentials(rustls::Error),
    #[error("client certificate verification with {}: {reason}", path.display())]
    Verifier { path: PathBuf, reason: String },
}

/// What the server needs to speak TLS: the mode and the rustls configuration built
/// from a certificate directory.
pub struct TlsSettings {
    pub mode: TlsMode,
    /// Client certificates must chain to the directory's `ca-cert.pem`.
    pub verify_peer: bool,
    /// The server's certificate: its name and the end of its validity.
    pub certificate: String,
    config: Arc<ServerConfig>,
}

impl TlsSettings {
    /// Read `server-cert.pem` (the certificate and its chain), `server-key.pem` and, with
    /// `verify_peer`, `ca-cert.pem` from `directory`.
    pub fn from_directory(directory: &Path, mode: TlsMode, verify_peer: bool) -> Result<TlsSettings, TlsSetupError> {
        let certificate_path = directory.join(SERVER_CERTIFICATE_FILE);
        let key_path = directory.join(SERVER_KEY_FILE);
        let chain = read_certificates(&certificate_path)?;
        let certificate = describe_certificate(&certificate_path, &chain[0])?;
        warn_if_others_can_read(&key_path);
        let key = PrivateKeyDer::from_pem_file(&key_path)
            .map_err(|error| TlsSetupError::File { path: key_path.clone(), reason: error.to_string() })?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(TlsSetupError::Credentials)?;
        let builder = if verify_peer {
            let authority_path = directory.join(CERTIFICATE_AUTHORITY_FILE);
            let mut roots = RootCertStore::empty();
            for certificate in read_certificates(&authority_path)? {
                roots.add(certificate).map_err(|error| TlsSetupError::Verifier {
                    path: authority_path.clone(),
                    reason: error.to_string(),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|error| TlsSetupError::Verifier { path: authority_path, reason: error.to_string() })?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_single_cert(chain, key).map_err(TlsSetupError::Credentials)?;
        // Sessions are long and few: resumption tickets would only be bytes on the wire.
        config.send_tls13_tickets = 0;
        Ok(TlsSettings { mode, verify_peer, certificate, config: Arc::new(config) })
    }
}

/// Certificates expiring within this time are warned about at start.
pub const CERTIFICATE_EXPIRY_WARNING: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// "CN=localhost, valid until ...": refused when it is not valid now (clients would refuse
/// it one by one), warned about when it expires within `CERTIFICATE_EXPIRY_WARNING`.
fn describe_certificate(path: &Path, certificate: &CertificateDer<'_>) -> Result<String, TlsSetupError> {
    let invalid = |reason: String| TlsSetupError::File { path: path.to_path_buf(), reason };
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate.as_ref())
        .map_err(|error| invalid(format!("the first certificate cannot be parsed: {error}")))?;
    let validity = parsed.validity();
    let name = subject_common_name(&parsed).map_or_else(|| parsed.subject().to_string(), |name| format!("CN={name}"));
    let Some(left) = validity.time_to_expiration() else {
        return Err(invalid(format!(
            "the certificate {name} is valid from {} to {}, not now",
            validity.not_before, validity.not_after
        )));
    };
    if left.whole_seconds() < CERTIFICATE_EXPIRY_WARNING.as_secs() as i64 {
        log::warn!("{}: the certificate {name} expires on {}: renew it", path.display(), validity.not_after);
    }
    Ok(format!("{name}, valid until {}", validity.not_after))
}

/// A private key others can read is a key others may have copied: said at start.
fn warn_if_others_can_read(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(metadata) = std::fs::metadata(path) {
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            log::warn!("{}: mode {mode:o} lets other users read the private key (chmod 600 it)", path.display());
        }
    }
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .map_err(|error| TlsSetupError::File { path: path.to_path_buf(), reason: error.to_string() })?;
    if certificates.is_empty() {
        return Err(TlsSetupError::NoCertificate { path: path.to_path_buf() });
    }
    Ok(certificates)
}

/// A connection once STARTTLS has succeeded.
pub(crate) struct Secured {
    /// The plain end of the socket pair: the server goes on with it as with any socket.
    pub stream: Box<dyn Connection>,
    /// The common name of the client's certificate, when it presented one that verified.
    pub client_name: Option<String>,
}

/// The TLS session of one connection, shared by its two pumps.
struct Session {
    tls: Mutex<ServerConnection>,
    /// Held from taking records out of the session until they are written, so records
    /// reach the client in the order the session made them.
    client_writer: Mutex<Box<dyn Connection>>,
}

/// Run the TLS handshake on `client` (the server has just acknowledged STARTTLS) and
/// start the pumps. The handshake's time limit is the read limit already set on `client`.
pub(crate) fn start(settings: &TlsSettings, mut client: Box<dyn Connection>) -> io::Result<Secured> {
    let mut tls = ServerConnection::new(settings.config.clone()).map_err(io::Error::other)?;
    // The pumps never hand the session more than a step at a time; its own limits on
    // unsent records must not turn a whole step into a short write.
    tls.set_buffer_limit(None);
    while tls.is_handshaking() {
        let (read, written) = tls.complete_io(&mut client)?;
        if read == 0 && written == 0 && tls.is_handshaking() {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the client left during the TLS handshake"));
        }
    }
    let client_name = tls.peer_certificates().and_then(|chain| chain.first()).and_then(|leaf| common_name(leaf));
    // A client sends its first options right behind its last handshake message: the
    // session may already hold them, and the pump must pass them on before it waits.
    let state = tls.process_new_packets().map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
    let mut early_plaintext = vec![0u8; state.plaintext_bytes_to_read()];
    tls.reader().read_exact(&mut early_plaintext)?;
    client.set_read_limit(None)?;
    let (plain_server, plain_pump) = UnixStream::pair()?;
    let session = Arc::new(Session { tls: Mutex::new(tls), client_writer: Mutex::new(client.try_clone_connection()?) });
    let (incoming_plain, outgoing_plain) = (plain_pump.try_clone()?, plain_pump);
    {
        let session = session.clone();
        std::thread::Builder::new()
            .name("nbd-tls-in".into())
            .spawn(move || pump_incoming(&session, client, incoming_plain, early_plaintext))?;
    }
    std::thread::Builder::new().name("nbd-tls-out".into()).spawn(move || pump_outgoing(&session, outgoing_plain))?;
    Ok(Secured { stream: Box::new(plain_server), client_name })
}

/// The subject's common name (CN) of a DER certificate.
fn common_name(certificate: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate.as_ref()).ok()?;
    subject_common_name(&parsed)
}

fn subject_common_name(certificate: &x509_parser::certificate::X509Certificate<'_>) -> Option<String> {
    Some(certificate.subject().iter_common_name().next()?.as_str().ok()?.to_string())
}

impl Session {
    /// Feed `ciphertext` to the session and append what it decrypts to `plaintext`.
    /// Returns whether the client has closed TLS (close_notify).
    fn decrypt(&self, mut ciphertext: &[u8], plaintext: &mut Vec<u8>) -> io::Result<bool> {
        let mut tls = self.tls.lock();
        let mut closed = false;
        while !ciphertext.is_empty() && !closed {
            if tls.read_tls(&mut ciphertext)? == 0 {
                break; // close_notify already received: nothing more is read
            }
            let state = match tls.process_new_packets() {
                Ok(state) => state,
                Err(error) => {
                    // The alert that says why goes out before the connection ends.
                    let _ = self.send_records(tls);
                    return Err(io::Error::new(io::ErrorKind::InvalidData, error));
                }
            };
            let start = plaintext.len();
            plaintext.resize(start + state.plaintext_bytes_to_read(), 0);
            tls.reader().read_exact(&mut plaintext[start..])?;
            closed = state.peer_has_closed();
        }
        if tls.wants_write() {
            // Records the session answers on its own (a key update).
            self.send_records(tls)?;
        }
        Ok(closed)
    }

    /// Take every record the session has ready and write them to the client, without
    /// holding the session while the write blocks.
    fn send_records(&self, mut tls: MutexGuard<'_, ServerConnection>) -> io::Result<()> {
        let mut records = Vec::new();
        while tls.wants_write() {
            tls.write_tls(&mut records)?;
        }
        let mut client = self.client_writer.lock();
        drop(tls);
        client.write_all(&records)
    }
}

/// Client → server: decrypt and pass the plaintext on, until either side ends.
/// `early_plaintext` is what the session decrypted during the handshake.
fn pump_incoming(session: &Session, mut client: Box<dyn Connection>, mut plain: UnixStream, early_plaintext: Vec<u8>) {
    let mut ciphertext = vec![0u8; TLS_PUMP_BUFFER_BYTES];
    let mut plaintext = Vec::with_capacity(TLS_PUMP_BUFFER_BYTES);
    if plain.write_all(&early_plaintext).is_err() {
        return;
    }
    loop {
        let count = match client.read(&mut ciphertext) {
            Ok(0) => break,
            Ok(count) => count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                log::debug!("TLS: reading from the client: {error}");
                break;
            }
        };
        plaintext.clear();
        let closed = match session.decrypt(&ciphertext[..count], &mut plaintext) {
            Ok(closed) => closed,
            Err(error) => {
                log::info!("TLS: the client's records: {error}");
                break;
            }
        };
        if plain.write_all(&plaintext).is_err() || closed {
            break;
        }
    }
    // The server's reader sees the end of its input; it ends the connection.
    let _ = plain.shutdown(std::net::Shutdown::Write);
}

/// Server → client: encrypt replies, until the server closes its end; then close TLS.
fn pump_outgoing(session: &Session, mut plain: UnixStream) {
    let mut buffer = vec![0u8; TLS_PUMP_BUFFER_BYTES];
    loop {
        let count = match plain.read(&mut buffer) {
            Ok(0) => break,
            Ok(count) => count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        let mut tls = session.tls.lock();
        if let Err(error) = tls.writer().write_all(&buffer[..count]) {
            log::debug!("TLS: encrypting a reply: {error}");
            break;
        }
        if let Err(error) = session.send_records(tls) {
            log::debug!("TLS: writing to the client: {error}");
            break;
        }
    }
    let mut tls = session.tls.lock();
    tls.send_close_notify();
    let _ = session.send_records(tls);
    // Ends the incoming pump's read too: the connection is over.
    session.client_writer.lock().shutdown_read();
}
