//! Connections: handshake, then transmission with many requests in flight and replies
//! out of order. One reader thread per connection parses requests (validating each once)
//! and hands them to a bounded pool of workers that run them on the volume and write the
//! replies under the connection's writer lock.

use crate::codec::{self, OptionRequest, ProtocolError, Request};
use crate::fair_share::Share;
use crate::protocol::*;
use crate::tls::{TlsMode, TlsSettings};
use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stripelog_engine::{Mapping, ReadQueue, Volume, BLOCK_SIZE_BYTES};

/// Largest request payload (read or write) a client may send; advertised as the maximum
/// block size. Larger writes are refused with EOVERFLOW after their payload is skipped.
pub const MAXIMUM_REQUEST_BYTES: u32 = 4 << 20;
/// Largest write payload the server reads and discards to refuse it politely; beyond it
/// the connection is closed (a client announcing 4 GiB is never buffered).
pub const DISCARD_LIMIT_BYTES: u32 = 64 << 20;
/// Requests in flight per connection: with `MAXIMUM_REQUEST_BYTES` this bounds a
/// connection's buffers to 128 MiB; the reader stops reading when it is reached.
pub const REQUESTS_IN_FLIGHT_PER_CONNECTION: usize = 32;
/// Worker threads per connection for requests that wait on the members (reads, flushes,
/// FUA): this many member reads can be in flight for one client.
pub const WORKERS_PER_CONNECTION: usize = 16;
/// Replies the reader collects before sending them in one write.
pub const PENDING_REPLIES_FLUSH_BYTES: usize = 64 << 10;
/// While the reader works through a burst of requests it sends the replies it has built
/// in groups of this many rather than once the burst is done, so the client works on the
/// first replies (and sends its next requests) while the reader parses the rest. Sending
/// only at the end of each burst made the client and the reader take turns. At depth 32,
/// 4 KiB writes on one connection, alternated runs against `nbdkit memory` gave a median
/// ratio of 0.79 that way and 0.83 with groups of four (BENCHMARKS.md, issue 24's eighth
/// session; the machine was noisy).
pub const PENDING_REPLIES_FLUSH_COUNT: usize = 4;
/// Reads up to this size go to the connection's read queue (`Volume::read_queue`): the
/// reader itself keeps them in flight through io_uring, and replies to each as it
/// finishes, between requests. Larger reads go to the workers.
pub const QUEUED_READ_MAXIMUM_BYTES: usize = 64 << 10;
/// Reads a connection's read queue holds at once (beside the requests with the workers,
/// bounded by `REQUESTS_IN_FLIGHT_PER_CONNECTION`); the reader answers reads before it
/// reads another request when it is reached.
pub const QUEUED_READS_IN_FLIGHT_MAXIMUM: usize = 32;
/// Member reads the read queue's ring holds per request in flight.
pub const QUEUED_READ_RING_ENTRIES_PER_REQUEST: usize = 4;
/// The reader's buffer: many small requests arrive per system call.
pub const READ_BUFFER_BYTES: usize = 256 << 10;
/// Block-status replies describe at most this many extents.
pub const BLOCK_STATUS_EXTENTS_MAXIMUM: usize = 1024;
/// A client must finish the handshake within this time (an idle one would hold a thread).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Connections served at once; more are closed right after they are accepted.
pub const MAXIMUM_CONNECTIONS: usize = 64;
/// The one meta context we serve.
const BASE_ALLOCATION_CONTEXT_ID: u32 = 1;

/// A volume offered under a name.
pub struct Export {
    pub name: String,
    pub description: String,
    pub volume: Arc<Volume>,
    pub read_only: bool,
    /// When not empty, only clients whose verified TLS certificate has one of these
    /// common names may open, list or query the export.
    pub allowed_clients: Vec<String>,
}

impl Export {
    fn transmission_flags(&self) -> u16 {
        let mut flags = TRANSMISSION_HAS_FLAGS
            | TRANSMISSION_SEND_FLUSH
            | TRANSMISSION_SEND_FUA
            | TRANSMISSION_CAN_MULTI_CONN
            | TRANSMISSION_SEND_CACHE;
        if self.read_only {
            flags |= TRANSMISSION_READ_ONLY;
        } else {
            flags |= TRANSMISSION_SEND_TRIM | TRANSMISSION_SEND_WRITE_ZEROES | TRANSMISSION_SEND_FAST_ZERO;
        }
        flags
    }

    fn size_bytes(&self) -> u64 {
        self.volume.logical_size_bytes()
    }

    /// Whether a client whose certificate names it `client_name` may use this export.
    fn admits(&self, client_name: Option<&str>) -> bool {
        self.allowed_clients.is_empty()
            || client_name.is_some_and(|name| self.allowed_clients.iter().any(|allowed| allowed == name))
    }
}

/// Counters for the summary printed on exit.
#[derive(Default)]
pub struct ServerStatistics {
    pub connections: AtomicU64,
    pub requests: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub errors: AtomicU64,
    /// STARTTLS handshakes that completed, and those that failed (a client certificate
    /// refused, no common protocol, a client that left).
    pub tls_handshakes_completed: AtomicU64,
    pub tls_handshakes_failed: AtomicU64,
}

/// A byte stream a connection runs on (Unix or TCP socket).
pub trait Connection: Read + Write + Send + 'static {
    fn try_clone_connection(&self) -> io::Result<Box<dyn Connection>>;
    /// Limit how long a read may wait (`None`: forever).
    fn set_read_limit(&self, limit: Option<Duration>) -> io::Result<()>;
    /// Stop reading (used at shutdown so the reader ends after its current request).
    fn shutdown_read(&self);
    /// Whether bytes are waiting to be read right now (never blocks).
    fn input_waiting(&self) -> bool;
    /// The socket's descriptor, for the read queue to watch (`ReadQueue::watch`).
    fn descriptor(&self) -> std::os::fd::RawFd;
}

/// Unix and TCP sockets are connections the same way.
macro_rules! socket_connection {
    ($socket:ty) => {
        impl Connection for $socket {
            fn try_clone_connection(&self) -> io::Result<Box<dyn Connection>> {
                Ok(Box::new(self.try_clone()?))
            }
            fn set_read_limit(&self, limit: Option<Duration>) -> io::Result<()> {
                self.set_read_timeout(limit)
            }
            fn shutdown_read(&self) {
                let _ = self.shutdown(std::net::Shutdown::Read);
            }
            fn descriptor(&self) -> std::os::fd::RawFd {
                std::os::fd::AsRawFd::as_raw_fd(self)
            }
            fn input_waiting(&self) -> bool {
                let mut descriptor =
                    libc::pollfd { fd: Connection::descriptor(self), events: libc::POLLIN, revents: 0 };
                // SAFETY: `descriptor` is a valid pollfd for the duration of the call, the
                // count is 1, and a zero timeout never blocks.
                let ready = unsafe { libc::poll(&mut descriptor, 1, 0) };
                ready == 1 && descriptor.revents & libc::POLLIN != 0
            }
        }

        impl AcceptedStream for $socket {
            fn set_blocking(&self) -> io::Result<()> {
                self.set_nonblocking(false)
            }
        }
    };
}

socket_connection!(std::os::unix::net::UnixStream);
socket_connection!(std::net::TcpStream);

pub struct Server {
    exports: Vec<Export>,
    pub statistics: ServerStatistics,
    /// Per export (same order): requests, bytes, latency and errors.
    metrics: Vec<crate::metrics::ExportMetrics>,
    shutting_down: AtomicBool,
    /// A connection's thread panicked (a bug): the server stopped (`Server::panicked`).
    panicked: AtomicBool,
    /// Read-side handles of open connections, to stop them at shutdown.
    open_connections: Mutex<Vec<(u64, Box<dyn Connection>)>>,
    next_connection: AtomicU64,
    /// STARTTLS: `None` refuses it (as `TlsMode::Off`).
    tls: Option<TlsSettings>,
    /// Each busy connection's share of the server.
    fair_share: crate::fair_share::FairShare,
}

/// What the handshake settled.
struct Negotiated {
    export: usize,
    structured_replies: bool,
    base_allocation: bool,
}

enum HandshakeEnd {
    Transmission(Negotiated),
    Closed,
}

impl Server {
    pub fn new(exports: Vec<Export>) -> Arc<Server> {
        Server::with_tls(exports, None)
    }

    /// A server that offers (`TlsMode::On`) or requires (`TlsMode::Require`) TLS.
    pub fn with_tls(exports: Vec<Export>, tls: Option<TlsSettings>) -> Arc<Server> {
        let tls = tls.filter(|settings| settings.mode != TlsMode::Off);
        Arc::new(Server {
            tls,
            metrics: exports.iter().map(|_| crate::metrics::ExportMetrics::default()).collect(),
            exports,
            statistics: ServerStatistics::default(),
            shutting_down: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            open_connections: Mutex::new(Vec::new()),
            next_connection: AtomicU64::new(1),
            fair_share: crate::fair_share::FairShare::new(MAXIMUM_CONNECTIONS),
        })
    }

    pub fn exports(&self) -> &[Export] {
        &self.exports
    }

    /// How the server treats STARTTLS.
    pub fn tls_mode(&self) -> TlsMode {
        self.tls.as_ref().map_or(TlsMode::Off, |settings| settings.mode)
    }

    /// The request metrics of each export, in the order of `exports`.
    pub fn metrics(&self) -> &[crate::metrics::ExportMetrics] {
        &self.metrics
    }

    /// Give the exports back (to close their volumes) once the server is done.
    pub fn into_exports(self) -> Vec<Export> {
        self.exports
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Whether a connection's thread panicked: a bug, after which the server stopped
    /// accepting and reading requests (its owner exits with an error).
    pub fn panicked(&self) -> bool {
        self.panicked.load(Ordering::SeqCst)
    }

    /// Stop accepting and stop reading new requests; requests in flight finish.
    pub fn shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        for (_, connection) in self.open_connections.lock().iter() {
            connection.shutdown_read();
        }
    }

    /// Accept connections on a Unix socket until shutdown; each runs on its own thread.
    pub fn run_unix(self: &Arc<Self>, listener: std::os::unix::net::UnixListener) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        self.accept_loop(|| listener.accept().map(|(stream, _)| (stream, "unix".to_string())))
    }

    pub fn run_tcp(self: &Arc<Self>, listener: std::net::TcpListener) -> io::Result<()> {
        listener.set_nonblocking(true)?;
        self.accept_loop(|| {
            let (stream, peer) = listener.accept()?;
            let _ = stream.set_nodelay(true);
            Ok((stream, peer.to_string()))
        })
    }

    fn accept_loop<S: Connection + AcceptedStream>(
        self: &Arc<Self>,
        accept: impl Fn() -> io::Result<(S, String)>,
    ) -> io::Result<()> {
        let mut threads = Vec::new();
        while !self.is_shutting_down() {
            match accept() {
                Ok((stream, peer)) => {
                    threads.retain(|thread: &std::thread::JoinHandle<()>| !thread.is_finished());
                    if threads.len() >= MAXIMUM_CONNECTIONS {
                        log::warn!("client={peer} refused: {MAXIMUM_CONNECTIONS} connections already");
                        continue; // dropping the stream closes it
                    }
                    stream.set_blocking()?;
                    let server = self.clone();
                    let spawned = std::thread::Builder::new()
                        .name("nbd-connection".into())
                        .spawn(move || server.serve_or_stop(Box::new(stream), peer));
                    match spawned {
                        Ok(thread) => threads.push(thread),
                        // Out of threads: the stream is dropped (closed) with the closure.
                        Err(error) => log::warn!("a connection refused: cannot start its thread: {error}"),
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => return Err(error),
            }
            threads.retain(|thread: &std::thread::JoinHandle<()>| !thread.is_finished());
        }
        for thread in threads {
            let _ = thread.join();
        }
        Ok(())
    }

    /// Serve a connection; a panic in it (a bug: nothing a client sends makes one) stops
    /// the whole server rather than leave it serving from a state the panic may have left
    /// half changed. The panic hook has logged it with its backtrace.
    fn serve_or_stop(self: &Arc<Self>, stream: Box<dyn Connection>, peer: String) {
        let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.serve(stream, peer.clone())));
        if served.is_err() {
            log::error!("client={peer}: the connection's thread panicked (a bug): the server stops");
            self.panicked.store(true, Ordering::SeqCst);
            self.shutdown();
        }
    }

    /// Serve one connection to its end (never panics on client input).
    pub fn serve(self: &Arc<Self>, stream: Box<dyn Connection>, peer: String) {
        let number = self.next_connection.fetch_add(1, Ordering::Relaxed);
        self.statistics.connections.fetch_add(1, Ordering::Relaxed);
        if let Ok(handle) = stream.try_clone_connection() {
            self.open_connections.lock().push((number, handle));
        }
        let outcome = self.run_connection(stream, number, &peer);
        self.open_connections.lock().retain(|(open, _)| *open != number);
        match outcome {
            Ok(summary) => log::debug!("connection={number} client={peer} closed {summary}"),
            // A client that hangs up mid-request or mid-handshake (a probe, a killed
            // process) is per-connection noise; anything else (a protocol error) is said.
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ) =>
            {
                log::debug!("connection={number} client={peer} ended: {error}")
            }
            Err(error) => log::info!("connection={number} client={peer} ended: {error}"),
        }
    }

    fn run_connection(
        self: &Arc<Self>,
        mut stream: Box<dyn Connection>,
        number: u64,
        peer: &str,
    ) -> io::Result<String> {
        stream.set_read_limit(Some(HANDSHAKE_TIMEOUT))?;
        let handshake = self.handshake(&mut stream);
        stream.set_read_limit(None)?;
        let negotiated = match handshake? {
            HandshakeEnd::Transmission(negotiated) => negotiated,
            HandshakeEnd::Closed => return Ok("during the handshake".into()),
        };
        let export = &self.exports[negotiated.export];
        log::debug!(
            "connection={number} client={peer} export={} size={} read_only={} structured_replies={} meta_context={}",
            export.name,
            export.size_bytes(),
            export.read_only,
            negotiated.structured_replies,
            if negotiated.base_allocation { META_CONTEXT_BASE_ALLOCATION } else { "none" }
        );
        crate::server::transmission(self.clone(), stream, negotiated)
    }

    fn find_export(&self, name: &str) -> Option<usize> {
        if name.is_empty() {
            return (!self.exports.is_empty()).then_some(0);
        }
        self.exports.iter().position(|export| export.name == name)
    }

    /// The export a client named, if it exists and admits the client; else the option
    /// error to answer (an export the client may not use is refused as policy).
    fn choose_export(&self, name: &str, client_name: Option<&str>) -> Result<usize, (u32, String)> {
        let Some(export) = self.find_export(name) else {
            return Err((REPLY_ERROR_UNKNOWN, format!("no export named '{name}'")));
        };
        if !self.exports[export].admits(client_name) {
            let client = client_name
                .map_or("a client without a verified certificate".to_string(), |name| format!("client '{name}'"));
            let message = format!("export '{}' does not admit {client} (--allow-clients)", self.exports[export].name);
            log::info!("{message}");
            return Err((REPLY_ERROR_POLICY, message));
        }
        Ok(export)
    }

    fn handshake(&self, stream: &mut Box<dyn Connection>) -> io::Result<HandshakeEnd> {
        stream.write_all(&codec::server_greeting())?;
        let mut flags = [0u8; 4];
        stream.read_exact(&mut flags)?;
        let client = codec::parse_client_flags(flags).map_err(protocol_error)?;
        let mut structured_replies = false;
        let mut base_allocation = false;
        // Whether STARTTLS has succeeded, and the verified client certificate's name.
        let mut tls_active = false;
        let mut client_name: Option<String> = None;
        loop {
            let mut header = [0u8; codec::OPTION_HEADER_BYTES];
            stream.read_exact(&mut header)?;
            let header = codec::parse_option_header(&header).map_err(protocol_error)?;
            // EXPORT_NAME has no error reply in the protocol: the answer to a bad one is to close.
            if header.option == OPTION_EXPORT_NAME && header.length > codec::STRING_MAXIMUM_BYTES {
                return Ok(HandshakeEnd::Closed);
            }
            if header.length > codec::OPTION_PAYLOAD_MAXIMUM_BYTES {
                if header.length > DISCARD_LIMIT_BYTES {
                    return Err(protocol_error(ProtocolError::OptionTooLarge(header.length)));
                }
                discard(stream, header.length as u64)?;
                stream.write_all(&codec::reply_error(header.option, REPLY_ERROR_TOO_BIG, "option too large"))?;
                continue;
            }
            let mut payload = vec![0u8; header.length as usize];
            stream.read_exact(&mut payload)?;
            let request = match codec::parse_option(header.option, &payload) {
                Ok(request) => request,
                Err(_) if header.option == OPTION_EXPORT_NAME => return Ok(HandshakeEnd::Closed),
                Err(error) => {
                    stream.write_all(&codec::reply_error(header.option, REPLY_ERROR_INVALID, &error.to_string()))?;
                    continue;
                }
            };
            let option = header.option;
            if self.tls_mode() == TlsMode::Require
                && !tls_active
                && !matches!(request, OptionRequest::StartTls | OptionRequest::Abort)
            {
                if option == OPTION_EXPORT_NAME {
                    return Ok(HandshakeEnd::Closed); // no error reply exists for it: close
                }
                let message = "TLS is required: send STARTTLS first";
                stream.write_all(&codec::reply_error(option, REPLY_ERROR_TLS_REQUIRED, message))?;
                continue;
            }
            match request {
                OptionRequest::ExportName { name } => {
                    let Ok(export) = self.choose_export(&name, client_name.as_deref()) else {
                        return Ok(HandshakeEnd::Closed); // the protocol's answer: close
                    };
                    let chosen = &self.exports[export];
                    stream.write_all(&codec::export_name_reply(
                        chosen.size_bytes(),
                        chosen.transmission_flags(),
                        client.no_zeroes,
                    ))?;
                    return Ok(HandshakeEnd::Transmission(Negotiated { export, structured_replies, base_allocation }));
                }
                OptionRequest::Abort => {
                    stream.write_all(&codec::option_reply(option, REPLY_ACK, &[]))?;
                    return Ok(HandshakeEnd::Closed);
                }
                OptionRequest::List => {
                    for export in self.exports.iter().filter(|export| export.admits(client_name.as_deref())) {
                        stream.write_all(&codec::reply_server_entry(option, &export.name, &export.description))?;
                    }
                    stream.write_all(&codec::option_reply(option, REPLY_ACK, &[]))?;
                }
                OptionRequest::StartTls => {
                    let Some(settings) = &self.tls else {
                        let message = "TLS is not offered (serve --tls-certificates DIR)";
                        stream.write_all(&codec::reply_error(option, REPLY_ERROR_UNSUPPORTED, message))?;
                        continue;
                    };
                    if tls_active {
                        stream.write_all(&codec::reply_error(option, REPLY_ERROR_INVALID, "TLS is already on"))?;
                        continue;
                    }
                    stream.write_all(&codec::option_reply(option, REPLY_ACK, &[]))?;
                    let secured = match crate::tls::start(settings, stream.try_clone_connection()?) {
                        Ok(secured) => secured,
                        Err(error) => {
                            self.statistics.tls_handshakes_failed.fetch_add(1, Ordering::Relaxed);
                            return Err(error);
                        }
                    };
                    self.statistics.tls_handshakes_completed.fetch_add(1, Ordering::Relaxed);
                    *stream = secured.stream;
                    stream.set_read_limit(Some(HANDSHAKE_TIMEOUT))?;
                    tls_active = true;
                    client_name = secured.client_name;
                    log::debug!(
                        "TLS on; client certificate {}",
                        client_name.as_deref().map_or("none".to_string(), |name| format!("CN={name}"))
                    );
                    // What was haggled before TLS is forgotten (proto.md).
                    structured_replies = false;
                    base_allocation = false;
                }
                OptionRequest::Info { name, information } | OptionRequest::Go { name, information } => {
                    let export = match self.choose_export(&name, client_name.as_deref()) {
                        Ok(export) => export,
                        Err((error, message)) => {
                            stream.write_all(&codec::reply_error(option, error, &message))?;
                            continue;
                        }
                    };
                    let chosen = &self.exports[export];
                    let mut reply = codec::reply_info_export(option, chosen.size_bytes(), chosen.transmission_flags());
                    if information.contains(&INFO_NAME) {
                        reply.extend(codec::reply_info_text(option, INFO_NAME, &chosen.name));
                    }
                    if information.contains(&INFO_DESCRIPTION) {
                        reply.extend(codec::reply_info_text(option, INFO_DESCRIPTION, &chosen.description));
                    }
                    reply.extend(codec::reply_info_block_size(
                        option,
                        512,
                        BLOCK_SIZE_BYTES as u32,
                        MAXIMUM_REQUEST_BYTES,
                    ));
                    reply.extend(codec::option_reply(option, REPLY_ACK, &[]));
                    stream.write_all(&reply)?;
                    if option == OPTION_GO {
                        return Ok(HandshakeEnd::Transmission(Negotiated {
                            export,
                            structured_replies,
                            base_allocation,
                        }));
                    }
                }
                OptionRequest::StructuredReply => {
                    if structured_replies {
                        stream.write_all(&codec::reply_error(option, REPLY_ERROR_INVALID, "already negotiated"))?;
                    } else {
                        structured_replies = true;
                        stream.write_all(&codec::option_reply(option, REPLY_ACK, &[]))?;
                    }
                }
                OptionRequest::ListMetaContext { name, queries } | OptionRequest::SetMetaContext { name, queries } => {
                    let setting = option == OPTION_SET_META_CONTEXT;
                    if !structured_replies {
                        let message = "meta contexts need structured replies";
                        stream.write_all(&codec::reply_error(option, REPLY_ERROR_INVALID, message))?;
                        continue;
                    }
                    if let Err((error, message)) = self.choose_export(&name, client_name.as_deref()) {
                        stream.write_all(&codec::reply_error(option, error, &message))?;
                        continue;
                    }
                    let wanted = queries.iter().any(|query| {
                        query == META_CONTEXT_BASE_ALLOCATION || (!setting && (query == "base:" || query.is_empty()))
                    }) || (!setting && queries.is_empty());
                    let mut reply = Vec::new();
                    if wanted {
                        reply.extend(codec::reply_meta_context(
                            option,
                            BASE_ALLOCATION_CONTEXT_ID,
                            META_CONTEXT_BASE_ALLOCATION,
                        ));
                    }
                    if setting {
                        base_allocation = wanted;
                    }
                    reply.extend(codec::option_reply(option, REPLY_ACK, &[]));
                    stream.write_all(&reply)?;
                }
                OptionRequest::Unknown { option } => {
                    stream.write_all(&codec::reply_error(option, REPLY_ERROR_UNSUPPORTED, "unknown option"))?;
                }
            }
        }
    }
}

/// Streams accepted from a non-blocking listener are switched back to blocking.
pub trait AcceptedStream {
    fn set_blocking(&self) -> io::Result<()>;
}
fn protocol_error(error: ProtocolError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error.to_string())
}

/// Read and drop `count` bytes in bounded pieces.
fn discard(stream: &mut dyn Read, count: u64) -> io::Result<()> {
    let mut scratch = [0u8; 64 << 10];
    let mut left = count;
    while left > 0 {
        let piece = left.min(scratch.len() as u64) as usize;
        stream.read_exact(&mut scratch[..piece])?;
        left -= piece as u64;
    }
    Ok(())
}

/// The engine's errors as NBD error numbers: the one place they are mapped.
pub fn wire_error(error: &stripelog_engine::Error) -> u32 {
    match error.errno() {
        1 => ERROR_PERMISSION,
        22 => ERROR_INVALID,
        28 => ERROR_NO_SPACE,
        108 => ERROR_SHUTDOWN,
        _ => ERROR_IO,
    }
}

/// Where a reply goes: straight to the socket (workers), or into the reader's pending
/// replies, sent in one write when the reader has no more requests at hand or a group is
/// due (`PendingReplies::is_due`).
pub(crate) struct Replies<'a>(Option<&'a mut PendingReplies>);

/// The replies the reader has built and not yet sent.
pub(crate) struct PendingReplies {
    bytes: Vec<u8>,
    count: usize,
}

impl PendingReplies {
    fn with_capacity(capacity_bytes: usize) -> PendingReplies {
        PendingReplies { bytes: Vec::with_capacity(capacity_bytes), count: 0 }
    }

    /// Add one reply made of `pieces`.
    fn push(&mut self, pieces: &[&[u8]]) {
        for piece in pieces {
            self.bytes.extend_from_slice(piece);
        }
        self.count += 1;
    }

    /// Whether the reader should send them now rather than read its next request:
    /// `PENDING_REPLIES_FLUSH_COUNT` replies or `PENDING_REPLIES_FLUSH_BYTES` bytes.
    fn is_due(&self) -> bool {
        self.count >= PENDING_REPLIES_FLUSH_COUNT || self.bytes.len() >= PENDING_REPLIES_FLUSH_BYTES
    }

    fn is_empty(&self) -> bool {
        self.count == 0
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.count = 0;
    }
}

/// One request handed to a worker.
struct Job {
    request: Request,
    /// When its header was read (its latency runs from there to its reply).
    received: Instant,
    payload: Vec<u8>,
    /// A refusal decided while parsing (error number and message).
    refusal: Option<(u32, String)>,
}

struct ConnectionState {
    server: Arc<Server>,
    export: usize,
    structured_replies: bool,
    base_allocation: bool,
    writer: Mutex<Box<dyn Connection>>,
    requests: AtomicU64,
    errors: AtomicU64,
}

fn transmission(server: Arc<Server>, stream: Box<dyn Connection>, negotiated: Negotiated) -> io::Result<String> {
    let writer = stream.try_clone_connection()?;
    let state = Arc::new(ConnectionState {
        server,
        export: negotiated.export,
        structured_replies: negotiated.structured_replies,
        base_allocation: negotiated.base_allocation,
        writer: Mutex::new(writer),
        requests: AtomicU64::new(0),
        errors: AtomicU64::new(0),
    });
    let metrics = &state.server.metrics[state.export];
    metrics.connections_total.fetch_add(1, Ordering::Relaxed);
    // Open until this function ends, however it ends.
    let _open = metrics.connection_opened();
    // Tokens bound the requests in flight: the reader takes one before reading a payload.
    let (token_return, tokens) = stripelog_engine::queue::bounded::<()>(REQUESTS_IN_FLIGHT_PER_CONNECTION);
    for _ in 0..REQUESTS_IN_FLIGHT_PER_CONNECTION {
        token_return.send(()).expect("capacity for every token");
    }
    let (job_sender, jobs) = stripelog_engine::queue::bounded::<Job>(REQUESTS_IN_FLIGHT_PER_CONNECTION);
    // This connection's share of the server among the busy ones.
    let share = state.server.fair_share.join();
    let result = std::thread::scope(|scope| {
        for _ in 0..WORKERS_PER_CONNECTION {
            let (state, jobs, token_return, share) = (&state, jobs.clone(), token_return.clone(), share.as_ref());
            let worker = move || {
                for job in jobs {
                    if let Err(error) = state.run(job, &mut Replies(None)) {
                        log::warn!("writing a reply failed: {error}");
                    }
                    share.inspect(|share| share.answered());
                    let _ = token_return.send(());
                }
            };
            // (Without a thread the connection has fewer workers: its requests wait longer.)
            if let Err(error) = std::thread::Builder::new().name("nbd-worker".into()).spawn_scoped(scope, worker) {
                log::warn!("a connection's worker thread did not start: {error}");
            }
        }
        let result = read_requests(&state, stream, share.as_ref(), &tokens, &job_sender);
        drop(job_sender);
        result
    });
    let statistics = &state.server.statistics;
    statistics.requests.fetch_add(state.requests.load(Ordering::Relaxed), Ordering::Relaxed);
    statistics.errors.fetch_add(state.errors.load(Ordering::Relaxed), Ordering::Relaxed);
    result.map(|()| {
        format!("requests={} errors={}", state.requests.load(Ordering::Relaxed), state.errors.load(Ordering::Relaxed))
    })
}

/// Requests that only touch memory (accepting writes into the open batch, the map) run
/// on the reader thread itself: no hand-off, and they complete before the next request
/// is read, so a later flush covers them. Requests that wait on the members go to workers.
fn runs_inline(request: &Request, volume: &Volume) -> bool {
    let fua = request.flags & COMMAND_FLAG_FUA != 0;
    let flushes_are_quick = volume.flushes_to_a_write_log();
    match request.command {
        // A partial block is merged with its old content, read from the members first: a
        // worker waits for that read, so that the reader goes on with the requests behind
        // it (several partial writes then read their blocks at once).
        _ if changes_part_of_a_block(request) => false,
        // So does a write whose index pages must be read first (a map cache smaller than
        // the index): the reader goes on, and several page loads are in flight at once.
        COMMAND_WRITE | COMMAND_TRIM | COMMAND_WRITE_ZEROES
            if !volume.index_pages_resident(request.offset_bytes, u64::from(request.length_bytes)) =>
        {
            false
        }
        COMMAND_WRITE | COMMAND_TRIM | COMMAND_WRITE_ZEROES => !fua || flushes_are_quick,
        COMMAND_FLUSH => flushes_are_quick,
        COMMAND_CACHE | COMMAND_BLOCK_STATUS => true,
        _ => false,
    }
}

/// Whether `request` writes, trims or zeroes part of a block (which the engine merges
/// with the block's old content).
fn changes_part_of_a_block(request: &Request) -> bool {
    let block = stripelog_engine::BLOCK_SIZE_BYTES as u64;
    let whole_blocks =
        request.offset_bytes.is_multiple_of(block) && u64::from(request.length_bytes).is_multiple_of(block);
    matches!(request.command, COMMAND_WRITE | COMMAND_TRIM | COMMAND_WRITE_ZEROES) && !whole_blocks
}

/// The connection's reads in its read queue, which the reader submits and answers.
struct QueuedReads {
    queue: ReadQueue,
    /// The request of each slot (the queue's tag) in flight, and when it was received.
    requests: Vec<Option<(Request, Instant)>>,
    free_slots: Vec<usize>,
    spare_buffers: Vec<Vec<u8>>,
}

/// How long `QueuedReads::answer` waits.
#[derive(Clone, Copy)]
enum WaitFor {
    Nothing,
    /// A read to finish.
    Read,
    /// A read to finish or the client to send more, whichever comes first.
    ReadOrRequest,
}

impl QueuedReads {
    fn new(state: &ConnectionState, stream: &dyn Connection) -> QueuedReads {
        let mut queue =
            state.export().volume.read_queue(QUEUED_READS_IN_FLIGHT_MAXIMUM * QUEUED_READ_RING_ENTRIES_PER_REQUEST);
        queue.watch(stream.descriptor());
        QueuedReads { queue, requests: Vec::new(), free_slots: Vec::new(), spare_buffers: Vec::new() }
    }

    fn in_flight(&self) -> usize {
        self.queue.in_flight()
    }

    fn submit(&mut self, request: Request, received: Instant) {
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.requests.push(None);
            self.requests.len() - 1
        });
        let length = request.length_bytes as usize;
        let mut buffer = self.spare_buffers.pop().unwrap_or_default();
        buffer.resize(length.max(buffer.len()), 0);
        self.queue.submit(slot as u64, request.offset_bytes, length, buffer);
        self.requests[slot] = Some((request, received));
    }

    /// Put the replies of the reads finished (waiting as `wait` says) into `pending`.
    fn answer(
        &mut self,
        state: &ConnectionState,
        share: Option<&Share>,
        wait: WaitFor,
        pending: &mut PendingReplies,
    ) -> io::Result<()> {
        let completed = match wait {
            WaitFor::Nothing => self.queue.complete(false),
            WaitFor::Read => self.queue.complete(true),
            WaitFor::ReadOrRequest => self.queue.complete_or_readable(),
        };
        let mut result = Ok(());
        for read in completed {
            let slot = read.tag as usize;
            let Some((request, received)) = self.requests.get_mut(slot).and_then(Option::take) else { continue };
            self.free_slots.push(slot);
            let length = request.length_bytes as usize;
            let replied = state.reply_read(&request, read.result, &read.buffer[..length], &mut Replies(Some(pending)));
            state.metrics().record(COMMAND_READ, length as u64, received.elapsed());
            share.inspect(|share| share.answered());
            self.spare_buffers.push(read.buffer);
            result = result.and(replied).and_then(|()| state.flush_pending_if_due(pending));
        }
        result
    }
}

/// The reader: parse and validate requests, read write payloads, run or queue them.
fn read_requests(
    state: &ConnectionState,
    stream: Box<dyn Connection>,
    share: Option<&Share>,
    tokens: &stripelog_engine::queue::Receiver<()>,
    jobs: &stripelog_engine::queue::Sender<Job>,
) -> io::Result<()> {
    let mut reads = QueuedReads::new(state, stream.as_ref());
    let mut stream = io::BufReader::with_capacity(READ_BUFFER_BYTES, stream);
    let mut pending = PendingReplies::with_capacity(PENDING_REPLIES_FLUSH_BYTES);
    let mut result = read_requests_into(state, &mut stream, share, tokens, jobs, &mut reads, &mut pending);
    // The reads still in flight are answered (a client that disconnects gets every reply
    // owed first), and whatever the reader answered goes out, even when the connection is
    // ending.
    while reads.in_flight() > 0 {
        let answered = reads.answer(state, share, WaitFor::Read, &mut pending);
        result = result.and(answered);
    }
    let flushed = state.flush_pending(&mut pending);
    result.and(flushed)
}

fn read_requests_into(
    state: &ConnectionState,
    stream: &mut io::BufReader<Box<dyn Connection>>,
    share: Option<&Share>,
    tokens: &stripelog_engine::queue::Receiver<()>,
    jobs: &stripelog_engine::queue::Sender<Job>,
    reads: &mut QueuedReads,
    pending: &mut PendingReplies,
) -> io::Result<()> {
    let export = &state.server.exports[state.export];
    let size = export.size_bytes();
    loop {
        // The replies of the reads that finished; then, about to wait for the client (no
        // whole request buffered, nothing more arrived), send what it is owed, and while
        // reads are in flight wait for whichever comes first: a read finishing or the
        // client sending more. While requests keep coming, replies gather into fewer,
        // larger sends.
        loop {
            reads.answer(state, share, WaitFor::Nothing, pending)?;
            if stream.buffer().len() >= codec::REQUEST_HEADER_BYTES || stream.get_ref().input_waiting() {
                break;
            }
            state.flush_pending(pending)?;
            if reads.in_flight() == 0 {
                break;
            }
            reads.answer(state, share, WaitFor::ReadOrRequest, pending)?;
        }
        // A connection ahead of its share lets the others catch up first (what it is owed
        // goes out before it pauses).
        while share.is_some_and(Share::ahead) && !state.server.is_shutting_down() {
            reads.answer(state, share, WaitFor::Nothing, pending)?;
            state.flush_pending(pending)?;
            std::thread::sleep(crate::fair_share::PAUSE);
        }
        let mut header = [0u8; codec::REQUEST_HEADER_BYTES];
        match stream.read_exact(&mut header) {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            // Shutdown stops reading: not an error.
            Err(_) if state.server.is_shutting_down() => return Ok(()),
            Err(error) => return Err(error),
        }
        let request = codec::parse_request(&header).map_err(protocol_error)?;
        let received = Instant::now();
        if request.command == COMMAND_DISCONNECT {
            return Ok(());
        }
        share.inspect(|share| {
            share.charge(crate::fair_share::request_cost(request.length_bytes, changes_part_of_a_block(&request)))
        });
        let carries_payload = request.command == COMMAND_WRITE;
        let refusal = validate(state, export, size, &request);
        if carries_payload && stream.buffer().len() < request.length_bytes as usize {
            // The rest of the payload is still on its way: what is owed goes out before
            // the reader waits for it (to read it or to discard it).
            state.flush_pending(pending)?;
        }
        if carries_payload && request.length_bytes > MAXIMUM_REQUEST_BYTES {
            if request.length_bytes > DISCARD_LIMIT_BYTES {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "write payload beyond every limit"));
            }
            discard(stream, request.length_bytes as u64)?;
        }
        let length = request.length_bytes as usize;
        if refusal.is_none() && request.command == COMMAND_READ && length <= QUEUED_READ_MAXIMUM_BYTES {
            // Blocks in memory are copied when the read is submitted; the others are read
            // through io_uring, and answered when they finish.
            state.requests.fetch_add(1, Ordering::Relaxed);
            while reads.in_flight() >= QUEUED_READS_IN_FLIGHT_MAXIMUM {
                reads.answer(state, share, WaitFor::Read, pending)?;
            }
            reads.submit(request, received);
            continue;
        }
        let inline = refusal.is_some() || runs_inline(&request, &export.volume);
        if !inline {
            tokens.recv().map_err(|_| io::Error::other("workers stopped"))?;
        }
        state.requests.fetch_add(1, Ordering::Relaxed);
        if inline && refusal.is_none() && carries_payload && stream.buffer().len() >= length {
            // The whole payload is already in the read buffer: the engine copies it from
            // there into the open batch (no allocation, no extra copy).
            state.write(&request, &stream.buffer()[..length], &mut Replies(Some(pending)))?;
            state.metrics().record(COMMAND_WRITE, length as u64, received.elapsed());
            share.inspect(|share| share.answered());
            io::BufRead::consume(stream, length);
            state.flush_pending_if_due(pending)?;
            continue;
        }
        let mut payload = Vec::new();
        if carries_payload && request.length_bytes <= MAXIMUM_REQUEST_BYTES {
            payload = vec![0u8; length];
            stream.read_exact(&mut payload)?;
        }
        let job = Job { request, received, payload, refusal };
        if inline {
            state.run(job, &mut Replies(Some(pending)))?;
            share.inspect(|share| share.answered());
            state.flush_pending_if_due(pending)?;
        } else {
            jobs.send(job).map_err(|_| io::Error::other("workers stopped"))?;
        }
    }
}

/// Check a request against the export once; `Some` is the refusal to send.
fn validate(state: &ConnectionState, export: &Export, size: u64, request: &Request) -> Option<(u32, String)> {
    let known_flags = COMMAND_FLAG_FUA
        | COMMAND_FLAG_NO_HOLE
        | COMMAND_FLAG_DONT_FRAGMENT
        | COMMAND_FLAG_REQUEST_ONE
        | COMMAND_FLAG_FAST_ZERO;
    if request.flags & !known_flags != 0 {
        return Some((ERROR_INVALID, format!("unknown command flags {:#x}", request.flags)));
    }
    let writes = matches!(request.command, COMMAND_WRITE | COMMAND_TRIM | COMMAND_WRITE_ZEROES);
    match request.command {
        COMMAND_READ | COMMAND_WRITE | COMMAND_FLUSH | COMMAND_TRIM | COMMAND_CACHE | COMMAND_WRITE_ZEROES => {}
        COMMAND_BLOCK_STATUS if request.length_bytes == 0 => {
            return Some((ERROR_INVALID, "block status of an empty range".into()));
        }
        COMMAND_BLOCK_STATUS if state.structured_replies && state.base_allocation => {}
        COMMAND_BLOCK_STATUS => return Some((ERROR_INVALID, "block status needs base:allocation".into())),
        other => return Some((ERROR_INVALID, format!("unknown command {other}"))),
    }
    if writes && export.read_only {
        return Some((ERROR_PERMISSION, "the export is read-only".into()));
    }
    // EOVERFLOW is reserved for reads with DONT_FRAGMENT; a request above the advertised
    // maximum block size is invalid.
    if matches!(request.command, COMMAND_READ | COMMAND_WRITE) && request.length_bytes > MAXIMUM_REQUEST_BYTES {
        return Some((ERROR_INVALID, format!("requests are limited to {MAXIMUM_REQUEST_BYTES} bytes")));
    }
    if request.command != COMMAND_FLUSH
        && request.offset_bytes.checked_add(request.length_bytes as u64).is_none_or(|end| end > size)
    {
        // The protocol: writing past the end is "no space", anything else is invalid.
        let error = if matches!(request.command, COMMAND_WRITE | COMMAND_WRITE_ZEROES) {
            ERROR_NO_SPACE
        } else {
            ERROR_INVALID
        };
        return Some((error, format!("range beyond the end of the export ({size} bytes)")));
    }
    None
}

impl ConnectionState {
    /// Send the reader's collected replies in one write.
    fn flush_pending(&self, pending: &mut PendingReplies) -> io::Result<()> {
        if pending.is_empty() {
            return Ok(());
        }
        let mut writer = self.writer.lock();
        writer.write_all(&pending.bytes)?;
        writer.flush()?;
        pending.clear();
        Ok(())
    }

    /// Send the collected replies once a group is due (`PendingReplies::is_due`).
    fn flush_pending_if_due(&self, pending: &mut PendingReplies) -> io::Result<()> {
        if pending.is_due() {
            self.flush_pending(pending)?;
        }
        Ok(())
    }

    fn export(&self) -> &Export {
        &self.server.exports[self.export]
    }

    fn metrics(&self) -> &crate::metrics::ExportMetrics {
        &self.server.metrics[self.export]
    }

    /// Run one request, write its reply, and count it.
    fn run(&self, job: Job, replies: &mut Replies) -> io::Result<()> {
        // A refused request is counted, but not the bytes it would have covered.
        let length = if job.refusal.is_some() { 0 } else { job.request.length_bytes as u64 };
        let (command, received) = (job.request.command, job.received);
        let result = self.execute(job, replies);
        self.metrics().record(command, length, received.elapsed());
        result
    }

    fn execute(&self, job: Job, replies: &mut Replies) -> io::Result<()> {
        let request = job.request;
        if let Some((error, message)) = job.refusal {
            return self.reply_error(&request, error, &message, replies);
        }
        let volume = &self.export().volume;
        let offset = request.offset_bytes;
        let length = request.length_bytes as u64;
        let fua = request.flags & COMMAND_FLAG_FUA != 0;
        let result = match request.command {
            COMMAND_READ => {
                let mut data = vec![0u8; request.length_bytes as usize];
                let read = volume.read(offset, &mut data);
                return self.reply_read(&request, read, &data, replies);
            }
            COMMAND_WRITE => return self.write(&request, &job.payload, replies),
            COMMAND_FLUSH => volume.flush(),
            COMMAND_TRIM => volume.trim(offset, length).and_then(|()| if fua { volume.flush() } else { Ok(()) }),
            COMMAND_WRITE_ZEROES => {
                if request.flags & COMMAND_FLAG_NO_HOLE != 0 {
                    volume.write_zeroes(offset, length, fua)
                } else {
                    volume.write_zeroes_as_hole(offset, length, fua)
                }
            }
            COMMAND_CACHE => Ok(()),
            COMMAND_BLOCK_STATUS => return self.reply_block_status(&request, replies),
            _ => unreachable!("validated"),
        };
        match result {
            Ok(()) => self.reply_done(&request, replies),
            Err(error) => self.reply_error(&request, wire_error(&error), &error.to_string(), replies),
        }
    }

    /// Run a validated write request and reply.
    fn write(&self, request: &Request, payload: &[u8], replies: &mut Replies) -> io::Result<()> {
        let fua = request.flags & COMMAND_FLAG_FUA != 0;
        match self.export().volume.write(request.offset_bytes, payload, fua) {
            Ok(()) => {
                self.server.statistics.bytes_written.fetch_add(payload.len() as u64, Ordering::Relaxed);
                self.reply_done(request, replies)
            }
            Err(error) => self.reply_error(request, wire_error(&error), &error.to_string(), replies),
        }
    }

    fn send(&self, bytes: &[&[u8]], replies: &mut Replies) -> io::Result<()> {
        if let Some(pending) = replies.0.as_deref_mut() {
            pending.push(bytes);
            return Ok(());
        }
        let mut writer = self.writer.lock();
        for piece in bytes {
            writer.write_all(piece)?;
        }
        writer.flush()
    }

    /// Success without a payload. The protocol allows a simple reply to everything but
    /// READ even when structured replies are negotiated, and it is what clients parse
    /// fastest: libnbd reads a simple reply's 16 bytes first and needs a second read
    /// for a structured chunk's header.
    fn reply_done(&self, request: &Request, replies: &mut Replies) -> io::Result<()> {
        self.send(&[&codec::simple_reply(0, request.cookie)], replies)
    }

    fn reply_error(&self, request: &Request, error: u32, message: &str, replies: &mut Replies) -> io::Result<()> {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.metrics().record_error(error);
        if self.structured_replies {
            self.send(&[&codec::structured_error(request.cookie, error, message)], replies)
        } else {
            // A simple reply to a failed read carries no data.
            self.send(&[&codec::simple_reply(error, request.cookie)], replies)
        }
    }

    /// Answer a read with `data`, or with the error the engine gave; the bytes of a
    /// successful one are counted.
    fn reply_read(
        &self,
        request: &Request,
        read: stripelog_engine::Result<()>,
        data: &[u8],
        replies: &mut Replies,
    ) -> io::Result<()> {
        match read {
            Ok(()) => {
                self.server.statistics.bytes_read.fetch_add(data.len() as u64, Ordering::Relaxed);
                self.reply_data(request, data, replies)
            }
            Err(error) => self.reply_error(request, wire_error(&error), &error.to_string(), replies),
        }
    }

    fn reply_data(&self, request: &Request, data: &[u8], replies: &mut Replies) -> io::Result<()> {
        // A data chunk carries at least one byte; an empty read is just done.
        // (A read is never answered with a simple reply once structured replies are on.)
        if self.structured_replies && data.is_empty() {
            return self.send(&[&codec::structured_header(REPLY_FLAG_DONE, CHUNK_NONE, request.cookie, 0)], replies);
        }
        if self.structured_replies {
            let header =
                codec::structured_header(REPLY_FLAG_DONE, CHUNK_OFFSET_DATA, request.cookie, 8 + data.len() as u32);
            self.send(&[&header, &request.offset_bytes.to_be_bytes(), data], replies)
        } else {
            self.send(&[&codec::simple_reply(0, request.cookie), data], replies)
        }
    }

    /// `base:allocation` straight from the map: data, zero records and holes.
    fn reply_block_status(&self, request: &Request, replies: &mut Replies) -> io::Result<()> {
        let volume = &self.export().volume;
        let block = BLOCK_SIZE_BYTES as u64;
        let end = request.offset_bytes + request.length_bytes as u64;
        let only_one = request.flags & COMMAND_FLAG_REQUEST_ONE != 0;
        let mut extents: Vec<(u32, u32)> = Vec::new();
        let mut position = request.offset_bytes;
        while position < end {
            let logical_block = position / block;
            let state = match volume.mapping(logical_block) {
                Ok(Mapping::Data { .. } | Mapping::Fragment { .. } | Mapping::Shared { .. }) => 0,
                Ok(Mapping::Zero { .. }) => STATE_ZERO,
                Ok(Mapping::Unmapped | Mapping::Trimmed { .. }) => STATE_HOLE | STATE_ZERO,
                Err(error) => return self.reply_error(request, wire_error(&error), &error.to_string(), replies),
            };
            let piece = ((logical_block + 1) * block).min(end) - position;
            match extents.last_mut() {
                Some((length, flags)) if *flags == state && (*length as u64 + piece) <= u32::MAX as u64 => {
                    *length += piece as u32;
                }
                _ => {
                    if extents.len() == BLOCK_STATUS_EXTENTS_MAXIMUM || (only_one && !extents.is_empty()) {
                        break;
                    }
                    extents.push((piece as u32, state));
                }
            }
            position += piece;
        }
        self.send(&[&codec::structured_block_status(request.cookie, BASE_ALLOCATION_CONTEXT_ID, &extents)], replies)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write whose index page is only in the log goes to a worker, which waits for the
    /// page load; one whose page is in RAM runs on the reader thread.
    #[test]
    fn a_write_that_must_read_its_index_page_first_goes_to_a_worker() {
        use stripelog_blockdev::{BlockDevice, MemoryDevice};
        use stripelog_engine::{CreateOptions, IoMode, MemberDevice, OpenOptions, RaidLevel};
        let members = (0..4)
            .map(|index| MemberDevice {
                name: format!("m{index}"),
                device: Some(Arc::new(MemoryDevice::new(24 << 20)) as Arc<dyn BlockDevice>),
            })
            .collect();
        let create = CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..Default::default() };
        // Two index pages in RAM; a checkpoint at every flush.
        let open = OpenOptions {
            flush_interval: None,
            io_mode: IoMode::Inline,
            cache_size_bytes: 0,
            checkpoint_interval: Duration::ZERO,
            map_cache_bytes: Some(2 * 4200),
            ..OpenOptions::default()
        };
        let volume = Volume::create(members, &create, &open).expect("create");
        let block = BLOCK_SIZE_BYTES as u64;
        let blocks = volume.logical_size_bytes() / block;
        let write = |offset_bytes: u64, flags: u16| Request {
            flags,
            command: COMMAND_WRITE,
            cookie: 1,
            offset_bytes,
            length_bytes: BLOCK_SIZE_BYTES as u32,
        };
        assert!(runs_inline(&write(0, 0), &volume), "nothing written: no page to read");
        let data = vec![7u8; 64 * BLOCK_SIZE_BYTES];
        for first in (0..blocks).step_by(64) {
            let count = 64.min(blocks - first) as usize;
            volume.write(first * block, &data[..count * BLOCK_SIZE_BYTES], false).expect("write");
        }
        volume.flush().expect("flush: a checkpoint, then eviction");
        let evicted = (0..blocks).step_by(1000).find(|&first| !volume.index_pages_resident(first * block, block));
        let evicted = evicted.expect("a page left RAM");
        assert!(!runs_inline(&write(evicted * block, 0), &volume), "block {evicted}: its page is only in the log");
        let mut out = vec![0u8; BLOCK_SIZE_BYTES];
        volume.read(evicted * block, &mut out).expect("read: loads the page");
        assert!(runs_inline(&write(evicted * block, 0), &volume), "block {evicted}: its page is in RAM");
        assert!(!runs_inline(&write(evicted * block, COMMAND_FLAG_FUA), &volume), "a FUA write waits on a flush");
        volume.close().expect("close");
    }

    #[test]
    fn pending_replies_fall_due_by_count_or_by_size() {
        let mut pending = PendingReplies::with_capacity(PENDING_REPLIES_FLUSH_BYTES);
        let simple = codec::simple_reply(0, 7);
        for _ in 1..PENDING_REPLIES_FLUSH_COUNT {
            pending.push(&[&simple]);
            assert!(!pending.is_due(), "{} replies of {} bytes", pending.count, pending.bytes.len());
        }
        pending.push(&[&simple]);
        assert!(pending.is_due(), "a group of {PENDING_REPLIES_FLUSH_COUNT} replies is due");
        pending.clear();
        assert!(pending.is_empty() && !pending.is_due());
        // One large read reply is due by itself.
        let data = vec![0u8; PENDING_REPLIES_FLUSH_BYTES];
        pending.push(&[&simple, &data]);
        assert!(pending.is_due(), "{} bytes pending", pending.bytes.len());
    }
}
