//! The benchmark's NBD client: the fixed newstyle handshake with NBD_OPT_GO (falling back
//! to NBD_OPT_EXPORT_NAME for old servers), simple replies only for the workload
//! (structured replies are not asked for, so a read's data follows its reply header; a
//! separate short connection asks `base:allocation` whether an export holds data before a
//! write benchmark), and many requests in
//! flight per connection: the benchmark thread sends requests, a receiver thread reads
//! replies and hands completions back. Messages are built and parsed by
//! `stripelog_nbd::codec`, the same code the server uses.

use crate::target::{Completion, Durability, IoQueue, Operation, Request, FIRST_PART};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use stripelog_nbd::codec;
use stripelog_nbd::protocol::*;

/// The IANA port of NBD.
pub const DEFAULT_PORT: u16 = 10809;
/// How long a server may take over one handshake step.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests gathered before they are written to the socket (larger payloads go straight).
pub const SEND_BUFFER_BYTES: usize = 256 << 10;
/// The receiver's buffer: many replies come in one system call.
pub const RECEIVE_BUFFER_BYTES: usize = 256 << 10;
/// The range one block status request asks about (its length field is 32 bits).
const BLOCK_STATUS_REQUEST_BYTES_MAXIMUM: u64 = 1 << 30;
/// The largest block status chunk accepted (a server sends a few thousand extents at most).
const BLOCK_STATUS_REPLY_BYTES_MAXIMUM: u32 = 1 << 20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NbdAddress {
    Unix(PathBuf),
    /// `host:port`.
    Tcp(String),
}

/// `nbd+unix:///NAME?socket=PATH` or `nbd://HOST[:PORT][/NAME]` (the NBD URI
/// specification's forms, without TLS): the address and the export name.
pub fn parse_uri(uri: &str) -> Result<(NbdAddress, String), String> {
    let bad = |why: &str| format!("{uri}: {why} (expected nbd+unix:///NAME?socket=PATH or nbd://HOST[:PORT]/NAME)");
    if let Some(rest) = uri.strip_prefix("nbd+unix://") {
        let (path_part, query) = rest.split_once('?').ok_or_else(|| bad("no ?socket="))?;
        if !path_part.is_empty() && !path_part.starts_with('/') {
            return Err(bad("a Unix socket URI has no host"));
        }
        let export = percent_decode(path_part.strip_prefix('/').unwrap_or(""))?;
        let socket = query
            .split('&')
            .find_map(|pair| pair.strip_prefix("socket="))
            .ok_or_else(|| bad("no socket= in the query"))?;
        if socket.is_empty() {
            return Err(bad("an empty socket path"));
        }
        return Ok((NbdAddress::Unix(PathBuf::from(percent_decode(socket)?)), export));
    }
    if let Some(rest) = uri.strip_prefix("nbd://") {
        let (authority, path) = match rest.split_once('/') {
            Some((authority, path)) => (authority, path),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(bad("no host"));
        }
        let has_port = authority.rsplit_once(':').is_some_and(|(_, port)| !port.contains(']'));
        let address = if has_port {
            let (host, port) = authority.rsplit_once(':').expect("checked");
            port.parse::<u16>().map_err(|_| bad("bad port"))?;
            format!("{host}:{port}")
        } else {
            format!("{authority}:{DEFAULT_PORT}")
        };
        return Ok((NbdAddress::Tcp(address), percent_decode(path)?));
    }
    Err(bad("not an NBD URI"))
}

fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = text.get(index + 1..index + 3).ok_or_else(|| format!("{text}: bad percent escape"))?;
            decoded.push(u8::from_str_radix(hex, 16).map_err(|_| format!("{text}: bad percent escape"))?);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).map_err(|_| format!("{text}: not UTF-8"))
}

/// A Unix or TCP socket.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn connect(address: &NbdAddress) -> io::Result<Stream> {
        Ok(match address {
            NbdAddress::Unix(path) => Stream::Unix(UnixStream::connect(path)?),
            NbdAddress::Tcp(address) => {
                let stream = TcpStream::connect(address.as_str())?;
                stream.set_nodelay(true)?;
                Stream::Tcp(stream)
            }
        })
    }
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(stream) => Stream::Unix(stream.try_clone()?),
            Stream::Tcp(stream) => Stream::Tcp(stream.try_clone()?),
        })
    }
    fn set_read_timeout(&self, limit: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(stream) => stream.set_read_timeout(limit),
            Stream::Tcp(stream) => stream.set_read_timeout(limit),
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Stream::Unix(stream) => stream.shutdown(std::net::Shutdown::Both),
            Stream::Tcp(stream) => stream.shutdown(std::net::Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(stream) => stream.read(buffer),
            Stream::Tcp(stream) => stream.read(buffer),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buffer: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(stream) => stream.write(buffer),
            Stream::Tcp(stream) => stream.write(buffer),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A connection in the transmission phase.
pub struct NbdConnection {
    stream: Stream,
    size_bytes: u64,
    transmission_flags: u16,
}

impl NbdConnection {
    /// Connect and negotiate `export`.
    pub fn connect(address: &NbdAddress, export: &str) -> Result<NbdConnection, String> {
        NbdConnection::connect_with(address, export, false)
    }

    /// Connect and negotiate `export`; with `allocation`, structured replies and the
    /// `base:allocation` meta context too (an error when the server offers neither).
    fn connect_with(address: &NbdAddress, export: &str, allocation: bool) -> Result<NbdConnection, String> {
        let place = match address {
            NbdAddress::Unix(path) => path.display().to_string(),
            NbdAddress::Tcp(address) => address.clone(),
        };
        let stream = Stream::connect(address).map_err(|error| format!("{place}: cannot connect: {error}"))?;
        stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).map_err(|error| format!("{place}: {error}"))?;
        let mut connection = NbdConnection { stream, size_bytes: 0, transmission_flags: 0 };
        connection.handshake(export, allocation).map_err(|error| format!("{place}: NBD handshake: {error}"))?;
        connection.stream.set_read_timeout(None).map_err(|error| format!("{place}: {error}"))?;
        Ok(connection)
    }

    /// Whether `export` holds data: the offset of its first extent that `base:allocation`
    /// does not report as reading zeros (a hole without the zero flag may hold anything,
    /// the protocol says), or `None` when there is none. An error when the server cannot
    /// say (no structured replies or no `base:allocation`).
    pub fn first_allocated_byte(address: &NbdAddress, export: &str) -> Result<Option<u64>, String> {
        let mut connection = NbdConnection::connect_with(address, export, true)?;
        let size = connection.size_bytes;
        let mut offset = 0u64;
        let mut cookie = 0u64;
        let found = loop {
            if offset >= size {
                break None;
            }
            let length = (size - offset).min(BLOCK_STATUS_REQUEST_BYTES_MAXIMUM);
            cookie += 1;
            let request = codec::Request {
                flags: 0,
                command: COMMAND_BLOCK_STATUS,
                cookie,
                offset_bytes: offset,
                length_bytes: length as u32,
            };
            connection.stream.write_all(&codec::encode_request(&request)).map_err(|error| error.to_string())?;
            let extents = connection.read_block_status(cookie)?;
            if extents.is_empty() {
                return Err("the server answered block status with no extent".into());
            }
            let mut position = offset;
            let data = extents.iter().find_map(|&(length, flags)| {
                let start = position;
                position += u64::from(length);
                (flags & STATE_ZERO == 0).then_some(start)
            });
            if data.is_some() {
                break data;
            }
            if position == offset {
                return Err("the server answered block status with extents of no length".into());
            }
            offset = position;
        };
        connection.disconnect();
        Ok(found)
    }

    /// Read the structured reply chunks of block status request `cookie` up to the one
    /// marked done: its extents (length, flags) in order.
    fn read_block_status(&mut self, cookie: u64) -> Result<Vec<(u32, u32)>, String> {
        let io = |error: io::Error| format!("reading a block status reply: {error}");
        let mut extents = Vec::new();
        loop {
            let header: [u8; 20] = self.read_array().map_err(io)?;
            let magic = u32::from_be_bytes(header[0..4].try_into().expect("4 bytes"));
            let flags = u16::from_be_bytes([header[4], header[5]]);
            let chunk_type = u16::from_be_bytes([header[6], header[7]]);
            let reply_cookie = u64::from_be_bytes(header[8..16].try_into().expect("8 bytes"));
            let length = u32::from_be_bytes(header[16..20].try_into().expect("4 bytes"));
            if magic != STRUCTURED_REPLY_MAGIC || reply_cookie != cookie {
                return Err(format!("unexpected reply (magic {magic:#x}, cookie {reply_cookie})"));
            }
            if length > BLOCK_STATUS_REPLY_BYTES_MAXIMUM {
                return Err(format!("a block status chunk of {length} bytes"));
            }
            let mut payload = vec![0u8; length as usize];
            self.stream.read_exact(&mut payload).map_err(io)?;
            match chunk_type {
                CHUNK_BLOCK_STATUS if payload.len() >= 4 => {
                    for descriptor in payload[4..].chunks_exact(8) {
                        extents.push((
                            u32::from_be_bytes(descriptor[0..4].try_into().expect("4 bytes")),
                            u32::from_be_bytes(descriptor[4..8].try_into().expect("4 bytes")),
                        ));
                    }
                }
                CHUNK_NONE => {}
                other if other & (1 << 15) != 0 => {
                    let message = payload.get(6..).map(String::from_utf8_lossy).unwrap_or_default();
                    return Err(format!("the server answered block status with an error: {message}"));
                }
                other => return Err(format!("unexpected reply chunk type {other}")),
            }
            if flags & REPLY_FLAG_DONE != 0 {
                return Ok(extents);
            }
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    pub fn read_only(&self) -> bool {
        self.transmission_flags & TRANSMISSION_READ_ONLY != 0
    }

    /// Whether the export takes NBD_CMD_FLUSH and the FUA flag.
    pub fn flush_and_fua(&self) -> (bool, bool) {
        (self.transmission_flags & TRANSMISSION_SEND_FLUSH != 0, self.transmission_flags & TRANSMISSION_SEND_FUA != 0)
    }

    fn read_array<const N: usize>(&mut self) -> io::Result<[u8; N]> {
        let mut bytes = [0u8; N];
        self.stream.read_exact(&mut bytes)?;
        Ok(bytes)
    }

    /// One option reply: its header and payload (at most `OPTION_PAYLOAD_MAXIMUM_BYTES`).
    fn read_option_reply(&mut self) -> Result<(codec::OptionReplyHeader, Vec<u8>), String> {
        let io = |error: io::Error| error.to_string();
        let header = codec::parse_option_reply_header(&self.read_array().map_err(io)?).map_err(|e| e.to_string())?;
        if header.length_bytes > codec::OPTION_PAYLOAD_MAXIMUM_BYTES {
            return Err(format!("an option reply of {} bytes", header.length_bytes));
        }
        let mut reply = vec![0u8; header.length_bytes as usize];
        self.stream.read_exact(&mut reply).map_err(io)?;
        Ok((header, reply))
    }

    /// NBD_OPT_STRUCTURED_REPLY, then NBD_OPT_SET_META_CONTEXT for `base:allocation`.
    fn negotiate_allocation(&mut self, export: &str) -> Result<(), String> {
        let io = |error: io::Error| error.to_string();
        self.stream.write_all(&codec::option_request(OPTION_STRUCTURED_REPLY, &[])).map_err(io)?;
        let (header, _) = self.read_option_reply()?;
        if header.reply != REPLY_ACK {
            return Err("the server has no structured replies, so it cannot report allocation".into());
        }
        let context = META_CONTEXT_BASE_ALLOCATION.as_bytes();
        let mut payload = Vec::with_capacity(12 + export.len() + context.len());
        payload.extend_from_slice(&(export.len() as u32).to_be_bytes());
        payload.extend_from_slice(export.as_bytes());
        payload.extend_from_slice(&1u32.to_be_bytes());
        payload.extend_from_slice(&(context.len() as u32).to_be_bytes());
        payload.extend_from_slice(context);
        self.stream.write_all(&codec::option_request(OPTION_SET_META_CONTEXT, &payload)).map_err(io)?;
        let mut selected = false;
        loop {
            let (header, reply) = self.read_option_reply()?;
            match header.reply {
                REPLY_META_CONTEXT if reply.get(4..) == Some(context) => selected = true,
                REPLY_META_CONTEXT => {}
                REPLY_ACK if selected => return Ok(()),
                REPLY_ACK => return Err("the server does not offer base:allocation".into()),
                error => {
                    return Err(format!(
                        "the server refused base:allocation ({error:#x}): {}",
                        String::from_utf8_lossy(&reply)
                    ))
                }
            }
        }
    }

    fn handshake(&mut self, export: &str, allocation: bool) -> Result<(), String> {
        let io = |error: io::Error| error.to_string();
        let greeting: [u8; 18] = self.read_array().map_err(io)?;
        let (magic, option_magic) = (
            u64::from_be_bytes(greeting[0..8].try_into().expect("8")),
            u64::from_be_bytes(greeting[8..16].try_into().expect("8")),
        );
        if magic != NBDMAGIC || option_magic != IHAVEOPT {
            return Err("not an NBD newstyle server".into());
        }
        let server_flags = u16::from_be_bytes([greeting[16], greeting[17]]);
        if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
            return Err("the server does not speak fixed newstyle".into());
        }
        let no_zeroes = server_flags & FLAG_NO_ZEROES != 0;
        let client_flags = CLIENT_FLAG_FIXED_NEWSTYLE | if no_zeroes { CLIENT_FLAG_NO_ZEROES } else { 0 };
        self.stream.write_all(&client_flags.to_be_bytes()).map_err(io)?;
        if allocation {
            self.negotiate_allocation(export)?;
        }

        let mut payload = Vec::with_capacity(6 + export.len());
        payload.extend_from_slice(&(export.len() as u32).to_be_bytes());
        payload.extend_from_slice(export.as_bytes());
        payload.extend_from_slice(&0u16.to_be_bytes());
        self.stream.write_all(&codec::option_request(OPTION_GO, &payload)).map_err(io)?;
        let mut export_info = None;
        loop {
            let (header, reply) = self.read_option_reply()?;
            if header.option != OPTION_GO {
                return Err(format!("a reply to option {} while negotiating GO", header.option));
            }
            match header.reply {
                REPLY_INFO if reply.len() >= 12 && u16::from_be_bytes([reply[0], reply[1]]) == INFO_EXPORT => {
                    export_info = Some((
                        u64::from_be_bytes(reply[2..10].try_into().expect("8 bytes")),
                        u16::from_be_bytes([reply[10], reply[11]]),
                    ));
                }
                REPLY_INFO => {}
                REPLY_ACK => {
                    let (size, flags) = export_info.ok_or("the server sent no export information")?;
                    (self.size_bytes, self.transmission_flags) = (size, flags);
                    return Ok(());
                }
                // Old servers: without NBD_OPT_GO there is no block status either.
                REPLY_ERROR_UNSUPPORTED if !allocation => return self.export_name(export, no_zeroes),
                error if error & (1 << 31) != 0 => {
                    return Err(format!(
                        "export {export:?}: the server refused ({error:#x}): {}",
                        String::from_utf8_lossy(&reply)
                    ));
                }
                other => return Err(format!("unexpected option reply {other:#x}")),
            }
        }
    }

    /// The old way in, for servers without NBD_OPT_GO.
    fn export_name(&mut self, export: &str, no_zeroes: bool) -> Result<(), String> {
        let io = |error: io::Error| error.to_string();
        self.stream.write_all(&codec::option_request(OPTION_EXPORT_NAME, export.as_bytes())).map_err(io)?;
        let answer: [u8; 10] = self.read_array().map_err(|error| format!("export {export:?} refused: {error}"))?;
        self.size_bytes = u64::from_be_bytes(answer[0..8].try_into().expect("8 bytes"));
        self.transmission_flags = u16::from_be_bytes([answer[8], answer[9]]);
        if !no_zeroes {
            let _: [u8; 124] = self.read_array().map_err(io)?;
        }
        Ok(())
    }

    /// End politely: NBD_CMD_DISC, then close.
    pub fn disconnect(mut self) {
        let _ = self.stream.write_all(&disconnect_request());
        self.stream.shutdown();
    }

    /// Turn the connection into a queue of `depth` slots with buffers of `buffer_bytes`.
    pub fn into_queue(self, depth: usize, buffer_bytes: usize) -> Result<NbdQueue, String> {
        let reader = self.stream.try_clone().map_err(|error| error.to_string())?;
        let control = self.stream.try_clone().map_err(|error| error.to_string())?;
        let read_lengths: Arc<Vec<AtomicU32>> = Arc::new((0..depth).map(|_| AtomicU32::new(0)).collect());
        // At most `depth` replies are owed, plus the receiver's last word.
        let (sender, completions) = stripelog_engine::queue::bounded(depth + 1);
        let lengths = read_lengths.clone();
        let receiver = std::thread::Builder::new()
            .name("nbd-receiver".into())
            .spawn(move || receive_replies(reader, &lengths, buffer_bytes, &sender))
            .map_err(|error| error.to_string())?;
        Ok(NbdQueue {
            flush_and_fua: self.flush_and_fua(),
            writer: BufWriter::with_capacity(SEND_BUFFER_BYTES, self.stream),
            control,
            buffers: (0..depth).map(|_| vec![0u8; buffer_bytes]).collect(),
            read_lengths,
            completions,
            receiver: Some(receiver),
            in_flight: 0,
        })
    }
}

/// NBD_CMD_DISC: the polite end of a connection.
fn disconnect_request() -> [u8; codec::REQUEST_HEADER_BYTES] {
    codec::encode_request(&codec::Request {
        flags: 0,
        command: COMMAND_DISCONNECT,
        cookie: 0,
        offset_bytes: 0,
        length_bytes: 0,
    })
}

/// What the receiver thread reports: a reply (its cookie, and whether it reports
/// success), or why the connection ended.
type Received = Result<(u64, Result<(), String>), String>;

/// The receiver thread: read replies until the connection ends.
fn receive_replies(
    stream: Stream,
    read_lengths: &[AtomicU32],
    buffer_bytes: usize,
    completions: &stripelog_engine::queue::Sender<Received>,
) {
    let mut scratch = vec![0u8; buffer_bytes];
    let mut stream = BufReader::with_capacity(RECEIVE_BUFFER_BYTES, stream);
    loop {
        let mut header = [0u8; 16];
        if let Err(error) = stream.read_exact(&mut header) {
            let _ = completions.send(Err(format!("the server closed the connection: {error}")));
            return;
        }
        let outcome = codec::parse_simple_reply(&header).map_err(|error| format!("bad reply: {error}")).and_then(
            |(error, cookie)| {
                let slot = usize::try_from(cookie & !FIRST_PART).ok().filter(|&slot| slot < read_lengths.len());
                let slot = slot.ok_or_else(|| format!("a reply for unknown cookie {cookie:#x}"))?;
                let length = read_lengths[slot].load(Ordering::Acquire) as usize;
                if error != 0 {
                    return Ok((cookie, Err(format!("the server answered error {error}"))));
                }
                if length > 0 {
                    // The data is not needed; it is read and dropped.
                    stream.read_exact(&mut scratch[..length]).map_err(|error| error.to_string())?;
                }
                Ok((cookie, Ok(())))
            },
        );
        let failed = outcome.is_err();
        if completions.send(outcome).is_err() || failed {
            return;
        }
    }
}

pub struct NbdQueue {
    /// The export takes NBD_CMD_FLUSH; the FUA flag.
    flush_and_fua: (bool, bool),
    writer: BufWriter<Stream>,
    /// A handle to shut the socket down at the end.
    control: Stream,
    buffers: Vec<Vec<u8>>,
    /// Per slot: the length of its read in flight (0 for other requests).
    read_lengths: Arc<Vec<AtomicU32>>,
    completions: stripelog_engine::queue::Receiver<Received>,
    receiver: Option<std::thread::JoinHandle<()>>,
    in_flight: usize,
}

impl IoQueue for NbdQueue {
    fn buffer(&mut self, slot: usize) -> &mut [u8] {
        &mut self.buffers[slot]
    }

    fn submit(&mut self, slot: usize, request: Request) -> Result<(), String> {
        let (command, read_length) = match request.operation {
            Operation::Read => (COMMAND_READ, request.length_bytes as u32),
            Operation::Write => (COMMAND_WRITE, 0),
        };
        let write = request.operation == Operation::Write;
        let (flags, cookie) = match request.durability {
            Durability::Fua if write && !self.flush_and_fua.1 => {
                return Err("the export does not take FUA writes (NBD_FLAG_SEND_FUA is not set)".into())
            }
            Durability::Flush if write && !self.flush_and_fua.0 => {
                return Err("the export does not take flushes (NBD_FLAG_SEND_FLUSH is not set)".into())
            }
            Durability::Fua if write => (COMMAND_FLAG_FUA, slot as u64),
            // The flush is sent once the write's reply is in (a flush covers only the
            // writes completed before it).
            Durability::Flush if write => (0, slot as u64 | FIRST_PART),
            _ => (0, slot as u64),
        };
        self.read_lengths[slot].store(read_length, Ordering::Release);
        let header = codec::encode_request(&codec::Request {
            flags,
            command,
            cookie,
            offset_bytes: request.offset_bytes,
            length_bytes: request.length_bytes as u32,
        });
        let sent = self.writer.write_all(&header).and_then(|()| match request.operation {
            Operation::Write => self.writer.write_all(&self.buffers[slot][..request.length_bytes]),
            Operation::Read => Ok(()),
        });
        sent.map_err(|error| format!("sending a request: {error}"))?;
        self.in_flight += 1;
        Ok(())
    }

    fn complete(&mut self, completions: &mut Vec<Completion>) -> Result<(), String> {
        self.writer.flush().map_err(|error| format!("sending requests: {error}"))?;
        if self.in_flight == 0 {
            return Ok(());
        }
        let before = completions.len();
        while completions.len() == before && self.in_flight > 0 {
            let first = self.completions.recv().map_err(|_| "the NBD receiver stopped".to_string())?;
            let mut flushes_sent = false;
            for received in std::iter::once(first).chain(self.completions.try_iter()) {
                let (cookie, outcome) = received?;
                self.in_flight -= 1;
                let slot = (cookie & !FIRST_PART) as usize;
                if cookie & FIRST_PART != 0 && outcome.is_ok() {
                    // A write-then-flush's write is done: now its flush.
                    let header = codec::encode_request(&codec::Request {
                        flags: 0,
                        command: COMMAND_FLUSH,
                        cookie: slot as u64,
                        offset_bytes: 0,
                        length_bytes: 0,
                    });
                    self.writer.write_all(&header).map_err(|error| format!("sending a flush: {error}"))?;
                    self.in_flight += 1;
                    flushes_sent = true;
                    continue;
                }
                completions.push((slot, outcome));
            }
            if flushes_sent {
                self.writer.flush().map_err(|error| format!("sending flushes: {error}"))?;
            }
        }
        Ok(())
    }
}

impl Drop for NbdQueue {
    fn drop(&mut self) {
        let _ = self.writer.write_all(&disconnect_request()).and_then(|()| self.writer.flush());
        self.control.shutdown();
        if let Some(receiver) = self.receiver.take() {
            let _ = receiver.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_name_the_socket_or_host_and_the_export() {
        assert_eq!(
            parse_uri("nbd+unix:///disk?socket=/run/sl.sock").unwrap(),
            (NbdAddress::Unix("/run/sl.sock".into()), "disk".into())
        );
        assert_eq!(parse_uri("nbd+unix:///?socket=s%20x").unwrap(), (NbdAddress::Unix("s x".into()), "".into()));
        assert_eq!(
            parse_uri("nbd://localhost/a%2Fb").unwrap(),
            (NbdAddress::Tcp("localhost:10809".into()), "a/b".into())
        );
        assert_eq!(parse_uri("nbd://127.0.0.1:7000").unwrap(), (NbdAddress::Tcp("127.0.0.1:7000".into()), "".into()));
        for bad in ["nbd+unix:///x", "nbd+unix://host/x?socket=s", "nbd://", "nbd://h:port/x", "http://x", "nbd://h/%4"]
        {
            assert!(parse_uri(bad).is_err(), "{bad}");
        }
    }
}
