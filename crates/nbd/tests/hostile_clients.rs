//! Raw NBD clients, well-behaved and hostile, against an in-process server.
//!
//! Every test builds its own RAID-5 volume on memory members, runs `Server::serve` on one
//! end of a `UnixStream::pair()` (on a thread of its own) and speaks the protocol byte by
//! byte on the other end. Client sockets time out after 5 s, so a server that hangs fails
//! a test instead of hanging it, and every `serve()` thread is waited for (with a
//! deadline) to show that the connection ended and that nothing panicked.

use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use stripelog_blockdev::{BlockDevice, FileDevice, FileDeviceOptions, MemoryDevice, Prng};
use stripelog_engine::{CreateOptions, MemberDevice, OpenOptions, RaidLevel, Volume, BLOCK_SIZE_BYTES};
use stripelog_nbd::codec::{self, Request, OPTION_PAYLOAD_MAXIMUM_BYTES};
use stripelog_nbd::protocol::*;
use stripelog_nbd::server::{DISCARD_LIMIT_BYTES, MAXIMUM_REQUEST_BYTES};
use stripelog_nbd::{Export, Server};

/// Read and write timeout of every client socket, and the longest `serve()` may take to
/// return once its client is gone.
const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// A server that refuses something outright must close at once, not after a timeout.
const PROMPTLY: Duration = Duration::from_secs(2);
const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const BLOCK: u64 = BLOCK_SIZE_BYTES as u64;
const DISK: &str = "disk";
const DISK_DESCRIPTION: &str = "writable test disk";
const READ_ONLY: &str = "ro";
const READ_ONLY_DESCRIPTION: &str = "the same volume, read-only";
const HOLE: u32 = STATE_HOLE | STATE_ZERO;
/// Writes and write-zeroes reaching past the end: ENOSPC, as proto.md recommends ("The
/// server SHOULD return ENOSPC if it receives a write request including one or more
/// sectors beyond the size of the device"); other commands get EINVAL.
const WRITE_PAST_THE_END: u32 = ERROR_NO_SPACE;
/// Reads and writes longer than the advertised maximum block size: EINVAL (EOVERFLOW is
/// for reads with NBD_CMD_FLAG_DF).
const OVER_THE_MAXIMUM: u32 = ERROR_INVALID;
const READ_WRITE_FLAGS: u16 = TRANSMISSION_HAS_FLAGS
    | TRANSMISSION_SEND_FLUSH
    | TRANSMISSION_SEND_FUA
    | TRANSMISSION_CAN_MULTI_CONN
    | TRANSMISSION_SEND_CACHE
    | TRANSMISSION_SEND_TRIM
    | TRANSMISSION_SEND_WRITE_ZEROES
    | TRANSMISSION_SEND_FAST_ZERO;
const READ_ONLY_FLAGS: u16 = TRANSMISSION_HAS_FLAGS
    | TRANSMISSION_SEND_FLUSH
    | TRANSMISSION_SEND_FUA
    | TRANSMISSION_CAN_MULTI_CONN
    | TRANSMISSION_SEND_CACHE
    | TRANSMISSION_READ_ONLY;

// ---------------------------------------------------------------------------------------
// Fixture: a server with two exports of one in-memory volume.

struct Fixture {
    server: Arc<Server>,
    size: u64,
    /// The member files' directory, removed with the fixture (`on_files`).
    directory: Option<std::path::PathBuf>,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(directory) = &self.directory {
            let _ = std::fs::remove_dir_all(directory);
        }
    }
}

impl Fixture {
    fn new() -> Fixture {
        let devices = (0..5).map(|_| Arc::new(MemoryDevice::new(16 * MIB)) as Arc<dyn BlockDevice>).collect();
        Fixture::with_devices(devices, &OpenOptions::default(), None)
    }

    /// Members in files, without a block cache: reads that miss the open batch are read
    /// from the files through the connection's read queue (io_uring), so they are in
    /// flight for a while.
    fn on_files(name: &str) -> Fixture {
        let directory = std::env::temp_dir().join(format!("stripelog-hostile-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&directory).expect("directory");
        let options = FileDeviceOptions { create_size_bytes: Some(16 * MIB), ..FileDeviceOptions::default() };
        let devices = (0..5)
            .map(|index| {
                Arc::new(FileDevice::open(&directory.join(format!("m{index}")), &options).expect("open a member file"))
                    as Arc<dyn BlockDevice>
            })
            .collect();
        Fixture::with_devices(devices, &OpenOptions { cache_size_bytes: 0, ..OpenOptions::default() }, Some(directory))
    }

    fn with_devices(
        devices: Vec<Arc<dyn BlockDevice>>,
        open: &OpenOptions,
        directory: Option<std::path::PathBuf>,
    ) -> Fixture {
        let members = devices
            .into_iter()
            .enumerate()
            .map(|(index, device)| MemberDevice { name: format!("m{index}"), device: Some(device) })
            .collect();
        let options = CreateOptions { raid_level: RaidLevel::Raid5, chunk_size_bytes: 64 << 10, ..Default::default() };
        let volume = Arc::new(Volume::create(members, &options, open).expect("create the volume"));
        let size = volume.logical_size_bytes();
        assert!(size >= 2 * MAXIMUM_REQUEST_BYTES as u64 + MIB, "volume of {size} bytes is too small for the tests");
        let exports = vec![
            Export {
                name: DISK.into(),
                description: DISK_DESCRIPTION.into(),
                volume: volume.clone(),
                read_only: false,
                allowed_clients: Vec::new(),
            },
            Export {
                name: READ_ONLY.into(),
                description: READ_ONLY_DESCRIPTION.into(),
                volume,
                read_only: true,
                allowed_clients: Vec::new(),
            },
        ];
        Fixture { server: Server::new(exports), size, directory }
    }

    /// Fixed newstyle with NO_ZEROES, STRUCTURED_REPLY, optionally SET_META_CONTEXT
    /// base:allocation, then GO; every reply checked.
    fn connect_structured(&self, name: &str, base_allocation: bool) -> Conn {
        let mut conn = Conn::open(self);
        conn.start(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES);
        conn.send_option(OPTION_STRUCTURED_REPLY, &[]);
        assert!(conn.expect_option_reply(OPTION_STRUCTURED_REPLY, REPLY_ACK).is_empty());
        conn.structured = true;
        if base_allocation {
            conn.send_option(OPTION_SET_META_CONTEXT, &meta_payload(name, &[META_CONTEXT_BASE_ALLOCATION]));
            let context = conn.expect_option_reply(OPTION_SET_META_CONTEXT, REPLY_META_CONTEXT);
            assert_eq!(&context[4..], META_CONTEXT_BASE_ALLOCATION.as_bytes());
            conn.context_id = Some(be32(&context[0..4]));
            assert!(conn.expect_option_reply(OPTION_SET_META_CONTEXT, REPLY_ACK).is_empty());
        }
        self.go(conn, name)
    }

    /// GO without structured replies: simple replies follow.
    fn connect_go_simple(&self, name: &str) -> Conn {
        let mut conn = Conn::open(self);
        conn.start(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES);
        self.go(conn, name)
    }

    fn go(&self, mut conn: Conn, name: &str) -> Conn {
        let info = conn
            .go(OPTION_GO, name, &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE])
            .unwrap_or_else(|error| panic!("GO {name}: {}", error.describe()));
        let (expected_name, expected_description, expected_flags) = match name {
            READ_ONLY => (READ_ONLY, READ_ONLY_DESCRIPTION, READ_ONLY_FLAGS),
            _ => (DISK, DISK_DESCRIPTION, READ_WRITE_FLAGS),
        };
        assert_eq!(info.size, Some(self.size));
        assert_eq!(info.flags, expected_flags, "transmission flags of {name}");
        assert_eq!(info.name.as_deref(), Some(expected_name));
        assert_eq!(info.description.as_deref(), Some(expected_description));
        assert_eq!(info.block_size, Some((512, BLOCK as u32, MAXIMUM_REQUEST_BYTES)));
        conn.size = self.size;
        conn.transmission_flags = info.flags;
        conn
    }

    /// The old way in: NBD_OPT_EXPORT_NAME, then size, flags and (without NO_ZEROES) the
    /// 124 zero bytes. Simple replies follow.
    fn connect_export_name(&self, name: &str, no_zeroes: bool) -> Conn {
        let mut conn = Conn::open(self);
        let flags = CLIENT_FLAG_FIXED_NEWSTYLE | if no_zeroes { CLIENT_FLAG_NO_ZEROES } else { 0 };
        conn.start(flags);
        conn.send_option(OPTION_EXPORT_NAME, name.as_bytes());
        let reply = conn.read_bytes(10);
        conn.size = be64(&reply[0..8]);
        conn.transmission_flags = be16(&reply[8..10]);
        assert_eq!(conn.size, self.size);
        if !no_zeroes {
            assert_eq!(conn.read_bytes(124), vec![0u8; 124], "the 124 zero bytes of EXPORT_NAME");
        }
        conn
    }
}

// ---------------------------------------------------------------------------------------
// A raw client.

/// One option reply.
struct OptionReply {
    option: u32,
    reply: u32,
    payload: Vec<u8>,
}

impl OptionReply {
    fn describe(&self) -> String {
        format!("option {} reply {:#x} {:?}", self.option, self.reply, String::from_utf8_lossy(&self.payload))
    }
}

/// What NBD_OPT_GO / NBD_OPT_INFO told.
#[derive(Default)]
struct ExportInfo {
    size: Option<u64>,
    flags: u16,
    name: Option<String>,
    description: Option<String>,
    block_size: Option<(u32, u32, u32)>,
}

/// One transmission reply (this server always answers with one final chunk).
#[derive(Default)]
struct Reply {
    cookie: u64,
    /// The chunk type of a structured reply; `None` for a simple reply.
    chunk: Option<u16>,
    error: u32,
    message: String,
    offset: Option<u64>,
    data: Vec<u8>,
    context: Option<u32>,
    extents: Vec<(u32, u32)>,
}

impl Reply {
    fn describe(&self) -> String {
        format!(
            "cookie {:#x} chunk {:?} error {} {:?} offset {:?} data {} bytes extents {:?}",
            self.cookie,
            self.chunk,
            self.error,
            self.message,
            self.offset,
            self.data.len(),
            self.extents
        )
    }

    /// Success without data: NBD_REPLY_TYPE_NONE (final) or a simple reply with error 0.
    fn assert_done(&self) {
        assert_eq!(self.error, 0, "{}", self.describe());
        if let Some(chunk) = self.chunk {
            assert_eq!(chunk, CHUNK_NONE, "{}", self.describe());
        }
        assert!(self.data.is_empty(), "{}", self.describe());
    }

    fn assert_error(&self, error: u32) {
        assert_eq!(self.error, error, "{}", self.describe());
        if let Some(chunk) = self.chunk {
            assert_eq!(chunk, CHUNK_ERROR, "{}", self.describe());
            assert!(!self.message.is_empty(), "error chunks carry a message");
        }
        assert!(self.data.is_empty(), "an error carries no data: {}", self.describe());
    }

    fn assert_data(&self, offset: u64, expected: &[u8]) {
        assert_eq!(self.error, 0, "{}", self.describe());
        if let Some(chunk) = self.chunk {
            assert_eq!(chunk, CHUNK_OFFSET_DATA, "{}", self.describe());
            assert_eq!(self.offset, Some(offset), "{}", self.describe());
        }
        assert_eq!(self.data.len(), expected.len(), "{}", self.describe());
        assert!(self.data == expected, "data read at {offset} differs from what was expected");
    }
}

struct Conn {
    stream: UnixStream,
    serving: Option<JoinHandle<()>>,
    structured: bool,
    size: u64,
    transmission_flags: u16,
    context_id: Option<u32>,
    next_cookie: u64,
    /// Simple replies do not say how much data follows: the lengths of the reads sent
    /// (with structured replies on: the reads in flight, which must not get a simple reply).
    read_lengths: HashMap<u64, usize>,
}

impl Conn {
    /// A connection with `serve()` running on its own thread; nothing read or sent yet.
    fn open(fixture: &Fixture) -> Conn {
        let (client, server_end) = UnixStream::pair().expect("socket pair");
        client.set_read_timeout(Some(IO_TIMEOUT)).expect("read timeout");
        client.set_write_timeout(Some(IO_TIMEOUT)).expect("write timeout");
        let server = fixture.server.clone();
        let serving = std::thread::Builder::new()
            .name("serve".into())
            .spawn(move || server.serve(Box::new(server_end), "hostile-test".into()))
            .expect("spawn serve()");
        Conn {
            stream: client,
            serving: Some(serving),
            structured: false,
            size: 0,
            transmission_flags: 0,
            context_id: None,
            next_cookie: 0x0123_4567_89AB_CDEF,
            read_lengths: HashMap::new(),
        }
    }

    fn read_bytes(&mut self, count: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; count];
        if let Err(error) = self.stream.read_exact(&mut bytes) {
            panic!("reading {count} bytes from the server: {error}");
        }
        bytes
    }

    fn send(&mut self, bytes: &[u8]) {
        if let Err(error) = self.stream.write_all(bytes) {
            panic!("sending {} bytes to the server: {error}", bytes.len());
        }
    }

    fn read_greeting(&mut self) {
        let greeting = self.read_bytes(18);
        assert_eq!(be64(&greeting[0..8]), NBDMAGIC);
        assert_eq!(be64(&greeting[8..16]), IHAVEOPT);
        assert_eq!(be16(&greeting[16..18]), FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    }

    /// Read the greeting and answer with `client_flags`.
    fn start(&mut self, client_flags: u32) {
        self.read_greeting();
        self.send(&client_flags.to_be_bytes());
    }

    fn send_option(&mut self, option: u32, payload: &[u8]) {
        let mut bytes = option_header(option, payload.len() as u32);
        bytes.extend_from_slice(payload);
        self.send(&bytes);
    }

    fn option_reply(&mut self) -> OptionReply {
        let header = self.read_bytes(20);
        assert_eq!(be64(&header[0..8]), OPTION_REPLY_MAGIC, "option reply magic in {header:02x?}");
        let (option, reply, length) = (be32(&header[8..12]), be32(&header[12..16]), be32(&header[16..20]));
        assert!(length as u64 <= 64 * KIB, "option reply of {length} bytes");
        let payload = self.read_bytes(length as usize);
        OptionReply { option, reply, payload }
    }

    fn expect_option_reply(&mut self, option: u32, reply: u32) -> Vec<u8> {
        let got = self.option_reply();
        assert_eq!((got.option, got.reply), (option, reply), "{}", got.describe());
        got.payload
    }

    /// NBD_OPT_GO or NBD_OPT_INFO: the information up to the ACK, or the error reply.
    fn go(&mut self, option: u32, name: &str, information: &[u16]) -> Result<ExportInfo, OptionReply> {
        self.send_option(option, &go_payload(name, information));
        let mut info = ExportInfo::default();
        loop {
            let reply = self.option_reply();
            assert_eq!(reply.option, option, "{}", reply.describe());
            match reply.reply {
                REPLY_ACK => {
                    assert!(reply.payload.is_empty());
                    assert!(info.size.is_some(), "GO/INFO must send NBD_INFO_EXPORT before the ACK");
                    return Ok(info);
                }
                REPLY_INFO => {
                    let rest = &reply.payload[2..];
                    match be16(&reply.payload[0..2]) {
                        INFO_EXPORT => {
                            assert_eq!(rest.len(), 10);
                            info.size = Some(be64(&rest[0..8]));
                            info.flags = be16(&rest[8..10]);
                        }
                        INFO_NAME => info.name = Some(String::from_utf8(rest.to_vec()).expect("UTF-8 name")),
                        INFO_DESCRIPTION => {
                            info.description = Some(String::from_utf8(rest.to_vec()).expect("UTF-8 description"))
                        }
                        INFO_BLOCK_SIZE => {
                            assert_eq!(rest.len(), 12);
                            info.block_size = Some((be32(&rest[0..4]), be32(&rest[4..8]), be32(&rest[8..12])));
                        }
                        other => panic!("unknown information type {other}"),
                    }
                }
                error if error & (1 << 31) != 0 => return Err(reply),
                other => panic!("unexpected reply {other:#x} to option {option}"),
            }
        }
    }

    fn cookie(&mut self) -> u64 {
        self.next_cookie = self.next_cookie.wrapping_add(0x9E37_79B9_7F4A_7C15);
        self.next_cookie
    }

    fn send_request(&mut self, flags: u16, command: u16, cookie: u64, offset: u64, length: u32, payload: &[u8]) {
        let request = Request { flags, command, cookie, offset_bytes: offset, length_bytes: length };
        if command == COMMAND_READ {
            self.read_lengths.insert(cookie, length as usize);
        }
        let mut bytes = codec::encode_request(&request).to_vec();
        bytes.extend_from_slice(payload);
        self.send(&bytes);
    }

    /// Send one request and read its reply.
    fn call(&mut self, flags: u16, command: u16, offset: u64, length: u32, payload: &[u8]) -> Reply {
        let cookie = self.cookie();
        self.send_request(flags, command, cookie, offset, length, payload);
        let reply = self.reply();
        assert_eq!(reply.cookie, cookie, "{}", reply.describe());
        reply
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Reply {
        self.call(0, COMMAND_WRITE, offset, data.len() as u32, data)
    }

    fn read(&mut self, offset: u64, length: u32) -> Reply {
        self.call(0, COMMAND_READ, offset, length, &[])
    }

    /// base:allocation extents of a range (checks the chunk and the context id).
    fn block_status(&mut self, flags: u16, offset: u64, length: u32) -> Vec<(u32, u32)> {
        let reply = self.call(flags, COMMAND_BLOCK_STATUS, offset, length, &[]);
        assert_eq!(reply.error, 0, "{}", reply.describe());
        assert_eq!(reply.chunk, Some(CHUNK_BLOCK_STATUS), "{}", reply.describe());
        assert_eq!(reply.context, self.context_id);
        assert!(!reply.extents.is_empty(), "at least one extent");
        assert!(reply.extents.iter().all(|&(length, _)| length > 0), "{:?}", reply.extents);
        let total: u64 = reply.extents.iter().map(|&(length, _)| length as u64).sum();
        assert!(total <= length as u64, "extents cover {total} bytes of a {length}-byte query");
        reply.extents
    }

    /// The next reply. With structured replies negotiated the server may still answer
    /// anything but a READ with a simple reply (the protocol allows it), so the magic decides.
    fn reply(&mut self) -> Reply {
        let magic = self.read_bytes(4);
        if self.structured && be32(&magic) == STRUCTURED_REPLY_MAGIC {
            self.structured_reply(magic)
        } else {
            self.simple_reply(magic)
        }
    }

    fn simple_reply(&mut self, magic: Vec<u8>) -> Reply {
        let mut header = magic;
        header.extend(self.read_bytes(12));
        assert_eq!(be32(&header[0..4]), SIMPLE_REPLY_MAGIC, "simple reply magic in {header:02x?}");
        let error = be32(&header[4..8]);
        let cookie = be64(&header[8..16]);
        let read_length = self.read_lengths.remove(&cookie);
        assert!(
            !(self.structured && read_length.is_some()),
            "a READ answered with a simple reply although structured replies are on: {header:02x?}"
        );
        let data = match (error, read_length) {
            (0, Some(length)) => self.read_bytes(length),
            _ => Vec::new(),
        };
        Reply { cookie, error, data, ..Default::default() }
    }

    fn structured_reply(&mut self, magic: Vec<u8>) -> Reply {
        let mut header = magic;
        header.extend(self.read_bytes(16));
        assert_eq!(be32(&header[0..4]), STRUCTURED_REPLY_MAGIC, "structured reply magic in {header:02x?}");
        let (flags, chunk) = (be16(&header[4..6]), be16(&header[6..8]));
        let (cookie, length) = (be64(&header[8..16]), be32(&header[16..20]));
        assert_eq!(flags, REPLY_FLAG_DONE, "every reply of this server is one final chunk");
        assert!(length <= MAXIMUM_REQUEST_BYTES + 8, "chunk of {length} bytes");
        let payload = self.read_bytes(length as usize);
        self.read_lengths.remove(&cookie);
        let mut reply = Reply { cookie, chunk: Some(chunk), ..Default::default() };
        match chunk {
            CHUNK_NONE => assert_eq!(length, 0, "NBD_REPLY_TYPE_NONE has no payload"),
            CHUNK_OFFSET_DATA => {
                assert!(length >= 8, "offset-data chunk of {length} bytes");
                reply.offset = Some(be64(&payload[0..8]));
                reply.data = payload[8..].to_vec();
            }
            CHUNK_BLOCK_STATUS => {
                assert!(length >= 4 && (length - 4) % 8 == 0, "block-status chunk of {length} bytes");
                reply.context = Some(be32(&payload[0..4]));
                reply.extents =
                    payload[4..].chunks_exact(8).map(|pair| (be32(&pair[0..4]), be32(&pair[4..8]))).collect();
            }
            CHUNK_ERROR => {
                assert!(length >= 6, "error chunk of {length} bytes");
                reply.error = be32(&payload[0..4]);
                assert_ne!(reply.error, 0, "an error chunk's error is not zero");
                let message_length = be16(&payload[4..6]) as usize;
                assert_eq!(6 + message_length, payload.len(), "error message length");
                reply.message = String::from_utf8(payload[6..].to_vec()).expect("UTF-8 error message");
            }
            other => panic!("unexpected chunk type {other}"),
        }
        reply
    }

    /// Read until the server closes; the bytes it sent before. Panics on a timeout.
    fn expect_closed(&mut self, what: &str) -> Vec<u8> {
        let mut received = Vec::new();
        let mut buffer = vec![0u8; 64 << 10];
        loop {
            match self.stream.read(&mut buffer) {
                Ok(0) => return received,
                Ok(count) => {
                    received.extend_from_slice(&buffer[..count]);
                    assert!(received.len() as u64 <= 16 * MIB, "{what}: the server keeps sending");
                }
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) if error.kind() == ErrorKind::ConnectionReset => return received,
                Err(error) => panic!("{what}: the server did not close the connection: {error}"),
            }
        }
    }

    /// `serve()` returns (within the deadline) and did not panic.
    fn wait_served(&mut self, what: &str) {
        let serving = self.serving.take().expect("waited for once");
        let deadline = Instant::now() + IO_TIMEOUT;
        while !serving.is_finished() {
            assert!(Instant::now() < deadline, "{what}: serve() still running after {IO_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(serving.join().is_ok(), "{what}: serve() panicked");
    }

    /// The server closes promptly (what it sent before is returned) and `serve()` ends.
    fn expect_dropped(mut self, what: &str) -> Vec<u8> {
        let started = Instant::now();
        let received = self.expect_closed(what);
        assert!(started.elapsed() < PROMPTLY, "{what}: closing took {:?}", started.elapsed());
        self.wait_served(what);
        received
    }

    /// NBD_CMD_DISC: no reply, the server closes.
    fn disconnect(mut self) {
        let cookie = self.cookie();
        self.send_request(0, COMMAND_DISCONNECT, cookie, 0, 0, &[]);
        assert!(self.expect_closed("after NBD_CMD_DISC").is_empty(), "NBD_CMD_DISC has no reply");
        self.wait_served("after NBD_CMD_DISC");
    }
}

// ---------------------------------------------------------------------------------------
// Encoding helpers.

fn be16(bytes: &[u8]) -> u16 {
    u16::from_be_bytes(bytes.try_into().expect("2 bytes"))
}

fn be32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes(bytes.try_into().expect("4 bytes"))
}

fn be64(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes.try_into().expect("8 bytes"))
}

fn option_header(option: u32, length: u32) -> Vec<u8> {
    let mut bytes = IHAVEOPT.to_be_bytes().to_vec();
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&length.to_be_bytes());
    bytes
}

fn string_field(text: &[u8]) -> Vec<u8> {
    let mut bytes = (text.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(text);
    bytes
}

fn go_payload(name: &str, information: &[u16]) -> Vec<u8> {
    let mut bytes = string_field(name.as_bytes());
    bytes.extend_from_slice(&(information.len() as u16).to_be_bytes());
    for item in information {
        bytes.extend_from_slice(&item.to_be_bytes());
    }
    bytes
}

fn meta_payload(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut bytes = string_field(name.as_bytes());
    bytes.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for query in queries {
        bytes.extend(string_field(query.as_bytes()));
    }
    bytes
}

/// Pseudo-random data (never a whole zero block, which would become a zero record).
fn pattern(seed: u64, length: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; length];
    Prng::new(seed).fill(&mut bytes);
    bytes
}

fn random_bytes(prng: &mut Prng, maximum: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; prng.below(maximum + 1) as usize];
    prng.fill(&mut bytes);
    bytes
}

// ---------------------------------------------------------------------------------------
// 1. A well-behaved client.

#[test]
fn well_behaved_client_runs_every_command() {
    let fixture = Fixture::new();
    let mut conn = fixture.connect_structured(DISK, true);
    let context = conn.context_id.expect("base:allocation was selected");

    // WRITE with FUA, READ back.
    let data = pattern(1, 128 * KIB as usize);
    conn.call(COMMAND_FLAG_FUA, COMMAND_WRITE, 64 * KIB, data.len() as u32, &data).assert_done();
    conn.read(64 * KIB, data.len() as u32).assert_data(64 * KIB, &data);

    // BLOCK_STATUS: never-written blocks are holes that read as zeros.
    let extents = conn.block_status(0, 0, 256 * KIB as u32);
    assert_eq!(extents, [(64 * KIB as u32, HOLE), (128 * KIB as u32, 0), (64 * KIB as u32, HOLE)]);

    // TRIM makes a hole, WRITE_ZEROES with NO_HOLE a zero record, WRITE_ZEROES without it
    // (and with FAST_ZERO) a hole again.
    conn.call(0, COMMAND_TRIM, 64 * KIB, 32 * KIB as u32, &[]).assert_done();
    conn.call(COMMAND_FLAG_NO_HOLE, COMMAND_WRITE_ZEROES, 96 * KIB, 32 * KIB as u32, &[]).assert_done();
    conn.call(COMMAND_FLAG_FAST_ZERO | COMMAND_FLAG_FUA, COMMAND_WRITE_ZEROES, 128 * KIB, BLOCK as u32, &[])
        .assert_done();
    let extents = conn.block_status(0, 0, 256 * KIB as u32);
    let expected = [
        (96 * KIB as u32, HOLE),
        (32 * KIB as u32, STATE_ZERO),
        (BLOCK as u32, HOLE),
        (60 * KIB as u32, 0),
        (64 * KIB as u32, HOLE),
    ];
    assert_eq!(extents, expected);
    // REQUEST_ONE: a single extent; a query starting mid-extent starts there.
    assert_eq!(conn.block_status(COMMAND_FLAG_REQUEST_ONE, 0, 256 * KIB as u32), [(96 * KIB as u32, HOLE)]);
    assert_eq!(conn.block_status(0, 100 * KIB, 8 * KIB as u32), [(8 * KIB as u32, STATE_ZERO)]);

    let mut expected_data = vec![0u8; 68 * KIB as usize];
    expected_data.extend_from_slice(&data[68 * KIB as usize..]);
    conn.read(64 * KIB, 128 * KIB as u32).assert_data(64 * KIB, &expected_data);

    // What the volume counts: write-zeroes as zeroes (with or without NO_HOLE), trims as
    // trims.
    let stats = fixture.server.exports()[0].volume.stats();
    assert_eq!(stats.host_bytes_trimmed, 32 * KIB, "one 32 KiB trim");
    assert_eq!(stats.host_bytes_zeroed, 32 * KIB + BLOCK, "32 KiB of zeroes with NO_HOLE, 4 KiB without");
    assert_eq!(stats.host_bytes_written, 128 * KIB);

    conn.call(0, COMMAND_FLUSH, 0, 0, &[]).assert_done();
    conn.call(0, COMMAND_CACHE, 0, 64 * KIB as u32, &[]).assert_done();
    assert_eq!(conn.context_id, Some(context));
    conn.disconnect();

    // A fresh connection sees the same content.
    let mut conn = fixture.connect_structured(DISK, false);
    conn.read(64 * KIB, 128 * KIB as u32).assert_data(64 * KIB, &expected_data);
    conn.disconnect();
}

#[test]
fn pipelined_requests_are_answered_by_cookie() {
    let fixture = Fixture::new();
    let mut conn = fixture.connect_structured(DISK, true);
    let base = MIB;
    let slot = |index: u64| base + index * 64 * KIB;
    let piece = 16 * KIB as usize;

    // 32 writes sent before any reply is read.
    let mut cookies = HashMap::new();
    for index in 0..32u64 {
        let cookie = conn.cookie();
        let data = pattern(100 + index, piece);
        conn.send_request(0, COMMAND_WRITE, cookie, slot(index), piece as u32, &data);
        cookies.insert(cookie, index);
    }
    for _ in 0..32 {
        let reply = conn.reply();
        assert!(cookies.remove(&reply.cookie).is_some(), "unknown or repeated cookie: {}", reply.describe());
        reply.assert_done();
    }

    // 32 mixed requests, one of them failing, sent before any reply is read.
    enum Expect {
        Data(u64, Vec<u8>),
        Status(Vec<(u32, u32)>),
        Done,
        Error(u32),
    }
    let mut expected = HashMap::new();
    for index in 0..32u64 {
        let cookie = conn.cookie();
        let expect = match index {
            0 | 1 => {
                conn.send_request(0, COMMAND_BLOCK_STATUS, cookie, slot(index), 32 * KIB as u32, &[]);
                Expect::Status(vec![(piece as u32, 0), (piece as u32, HOLE)])
            }
            2 => {
                conn.send_request(0, COMMAND_FLUSH, cookie, 0, 0, &[]);
                Expect::Done
            }
            3 => {
                conn.send_request(0, COMMAND_CACHE, cookie, slot(3), piece as u32, &[]);
                Expect::Done
            }
            4 => {
                conn.send_request(0, COMMAND_READ, cookie, fixture.size, 4096, &[]);
                Expect::Error(ERROR_INVALID)
            }
            5 => {
                conn.send_request(0, 200, cookie, 0, 4096, &[]);
                Expect::Error(ERROR_INVALID)
            }
            _ => {
                conn.send_request(0, COMMAND_READ, cookie, slot(index), piece as u32, &[]);
                Expect::Data(slot(index), pattern(100 + index, piece))
            }
        };
        expected.insert(cookie, expect);
    }
    for _ in 0..32 {
        let reply = conn.reply();
        match expected.remove(&reply.cookie) {
            Some(Expect::Data(offset, data)) => reply.assert_data(offset, &data),
            Some(Expect::Status(extents)) => {
                assert_eq!(reply.chunk, Some(CHUNK_BLOCK_STATUS), "{}", reply.describe());
                assert_eq!(reply.context, conn.context_id);
                assert_eq!(reply.extents, extents);
            }
            Some(Expect::Done) => reply.assert_done(),
            Some(Expect::Error(error)) => reply.assert_error(error),
            None => panic!("unknown or repeated cookie: {}", reply.describe()),
        }
    }

    // Writes, then NBD_CMD_DISC before reading anything: every write is still answered,
    // then the connection closes.
    let mut cookies = HashMap::new();
    for index in 32..36u64 {
        let cookie = conn.cookie();
        conn.send_request(
            COMMAND_FLAG_FUA,
            COMMAND_WRITE,
            cookie,
            slot(index),
            piece as u32,
            &pattern(100 + index, piece),
        );
        cookies.insert(cookie, index);
    }
    let disc = conn.cookie();
    conn.send_request(0, COMMAND_DISCONNECT, disc, 0, 0, &[]);
    for _ in 0..4 {
        let reply = conn.reply();
        assert!(cookies.remove(&reply.cookie).is_some(), "{}", reply.describe());
        reply.assert_done();
    }
    assert!(conn.expect_closed("after pipelined writes and DISC").is_empty());
    conn.wait_served("after pipelined writes and DISC");

    // Reads, then the client half-closes without NBD_CMD_DISC: the reads are answered,
    // then the server closes.
    let mut conn = fixture.connect_structured(DISK, false);
    let mut expected = HashMap::new();
    for index in 32..36u64 {
        let cookie = conn.cookie();
        conn.send_request(0, COMMAND_READ, cookie, slot(index), piece as u32, &[]);
        expected.insert(cookie, index);
    }
    conn.stream.shutdown(Shutdown::Write).expect("half-close");
    for _ in 0..4 {
        let reply = conn.reply();
        let index = expected.remove(&reply.cookie).expect("known cookie");
        reply.assert_data(slot(index), &pattern(100 + index, piece));
    }
    assert!(conn.expect_closed("after a half-close").is_empty());
    conn.wait_served("after a half-close");
}

#[test]
fn replies_go_out_before_the_reader_waits_for_a_payload() {
    // A client may send a write's payload slowly, or only once it has the replies it is
    // owed: the reader must not hold those replies while it waits for the payload.
    let fixture = Fixture::new();
    let mut conn = fixture.connect_structured(DISK, false);
    let piece = 4096;
    let (first_data, second_data) = (pattern(41, piece), pattern(42, piece));
    let first = conn.cookie();
    conn.send_request(0, COMMAND_WRITE, first, MIB, piece as u32, &first_data);
    let second = conn.cookie();
    let request = Request {
        flags: 0,
        command: COMMAND_WRITE,
        cookie: second,
        offset_bytes: MIB + piece as u64,
        length_bytes: piece as u32,
    };
    let mut bytes = codec::encode_request(&request).to_vec();
    bytes.extend_from_slice(&second_data[..piece / 2]);
    conn.send(&bytes);
    conn.stream.set_read_timeout(Some(PROMPTLY)).expect("read timeout");
    let reply = conn.reply();
    assert_eq!(reply.cookie, first, "{}", reply.describe());
    reply.assert_done();
    conn.stream.set_read_timeout(Some(IO_TIMEOUT)).expect("read timeout");
    conn.send(&second_data[piece / 2..]);
    let reply = conn.reply();
    assert_eq!(reply.cookie, second, "{}", reply.describe());
    reply.assert_done();
    let mut expected = first_data;
    expected.extend_from_slice(&second_data);
    conn.read(MIB, 2 * piece as u32).assert_data(MIB, &expected);
    conn.disconnect();
}

#[test]
fn reads_in_flight_are_answered_when_the_client_half_closes() {
    // Reads of member files are still with the kernel when the reader meets the end of
    // the client's stream: each is answered before the server closes.
    let fixture = Fixture::on_files("half-close");
    let mut conn = fixture.connect_structured(DISK, false);
    let piece = 16 * KIB as usize;
    let slot = |index: u64| MIB + index * 64 * KIB;
    for round in 0..2 {
        for index in 0..32u64 {
            let cookie = conn.cookie();
            conn.send_request(0, COMMAND_WRITE, cookie, slot(index), piece as u32, &pattern(300 + index, piece));
            conn.reply().assert_done();
        }
        // On the members (the open batch written), so the reads below need them.
        let cookie = conn.cookie();
        conn.send_request(0, COMMAND_FLUSH, cookie, 0, 0, &[]);
        conn.reply().assert_done();
        let mut expected = HashMap::new();
        for index in 0..32u64 {
            let cookie = conn.cookie();
            conn.send_request(0, COMMAND_READ, cookie, slot(index), piece as u32, &[]);
            expected.insert(cookie, index);
        }
        if round == 1 {
            conn.stream.shutdown(Shutdown::Write).expect("half-close");
        }
        for _ in 0..32 {
            let reply = conn.reply();
            let index = expected.remove(&reply.cookie).expect("known cookie");
            reply.assert_data(slot(index), &pattern(300 + index, piece));
        }
    }
    assert!(conn.expect_closed("after a half-close with reads in flight").is_empty());
    conn.wait_served("after a half-close with reads in flight");
}

// ---------------------------------------------------------------------------------------
// 2. Simple replies.

#[test]
fn simple_replies_after_export_name() {
    let fixture = Fixture::new();

    // Without NO_ZEROES the 124 zero bytes come (checked by the helper), and then nothing
    // more: the first reply starts right after them.
    let mut conn = fixture.connect_export_name(DISK, false);
    assert_eq!(conn.transmission_flags, READ_WRITE_FLAGS);
    let data = pattern(2, 8 * KIB as usize);
    conn.write(MIB, &data).assert_done();
    conn.read(MIB, data.len() as u32).assert_data(MIB, &data);
    // Errors carry no data, and the stream stays in step.
    conn.read(fixture.size - BLOCK, 2 * BLOCK as u32).assert_error(ERROR_INVALID);
    conn.call(0, COMMAND_BLOCK_STATUS, 0, BLOCK as u32, &[]).assert_error(ERROR_INVALID);
    conn.read(MIB, data.len() as u32).assert_data(MIB, &data);
    conn.call(COMMAND_FLAG_FUA, COMMAND_FLUSH, 0, 0, &[]).assert_done();
    conn.disconnect();

    // With NO_ZEROES the transmission starts right after size and flags.
    let mut conn = fixture.connect_export_name(DISK, true);
    conn.read(MIB, data.len() as u32).assert_data(MIB, &data);
    conn.call(0, COMMAND_TRIM, MIB, BLOCK as u32, &[]).assert_done();
    conn.read(MIB, BLOCK as u32).assert_data(MIB, &[0u8; BLOCK as usize]);
    conn.disconnect();

    // The empty name is the default export (the first one).
    let mut conn = fixture.connect_export_name("", true);
    assert_eq!(conn.transmission_flags, READ_WRITE_FLAGS);
    conn.read(MIB + BLOCK, BLOCK as u32).assert_data(MIB + BLOCK, &data[BLOCK as usize..]);
    conn.disconnect();

    // The read-only export through EXPORT_NAME.
    let mut conn = fixture.connect_export_name(READ_ONLY, false);
    assert_eq!(conn.transmission_flags, READ_ONLY_FLAGS);
    conn.write(MIB, &data).assert_error(ERROR_PERMISSION);
    conn.read(MIB + BLOCK, BLOCK as u32).assert_data(MIB + BLOCK, &data[BLOCK as usize..]);
    conn.disconnect();

    // GO without STRUCTURED_REPLY: simple replies, and no block status.
    let mut conn = fixture.connect_go_simple(DISK);
    conn.read(MIB + BLOCK, BLOCK as u32).assert_data(MIB + BLOCK, &data[BLOCK as usize..]);
    conn.call(0, COMMAND_BLOCK_STATUS, 0, BLOCK as u32, &[]).assert_error(ERROR_INVALID);
    conn.disconnect();

    // Structured replies but no meta context: block status is an error chunk.
    let mut conn = fixture.connect_structured(DISK, false);
    conn.call(0, COMMAND_BLOCK_STATUS, 0, BLOCK as u32, &[]).assert_error(ERROR_INVALID);
    conn.read(MIB + BLOCK, BLOCK as u32).assert_data(MIB + BLOCK, &data[BLOCK as usize..]);
    conn.disconnect();
}

// ---------------------------------------------------------------------------------------
// 3. Option errors.

#[test]
fn option_errors_are_answered_and_negotiation_continues() {
    let fixture = Fixture::new();
    let mut conn = Conn::open(&fixture);
    conn.start(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES);

    conn.send_option(1234, b"xyz");
    conn.expect_option_reply(1234, REPLY_ERROR_UNSUPPORTED);
    conn.send_option(OPTION_STARTTLS, &[]);
    conn.expect_option_reply(OPTION_STARTTLS, REPLY_ERROR_UNSUPPORTED);

    let error = conn.go(OPTION_GO, "nope", &[]).err().expect("GO of an unknown export fails");
    assert_eq!((error.option, error.reply), (OPTION_GO, REPLY_ERROR_UNKNOWN), "{}", error.describe());
    let error = conn.go(OPTION_INFO, "nope", &[INFO_NAME]).err().expect("INFO of an unknown export fails");
    assert_eq!((error.option, error.reply), (OPTION_INFO, REPLY_ERROR_UNKNOWN), "{}", error.describe());

    // Malformed GO payloads: a name longer than the payload, a missing count, a trailing
    // byte, an information count with no entries.
    for payload in [vec![0, 0, 0, 9, b'a'], string_field(b"disk"), [go_payload(DISK, &[]), vec![7]].concat(), {
        let mut payload = string_field(b"disk");
        payload.extend_from_slice(&3u16.to_be_bytes());
        payload
    }] {
        conn.send_option(OPTION_GO, &payload);
        conn.expect_option_reply(OPTION_GO, REPLY_ERROR_INVALID);
    }
    conn.send_option(OPTION_LIST, b"x");
    conn.expect_option_reply(OPTION_LIST, REPLY_ERROR_INVALID);

    // Meta contexts need structured replies first.
    conn.send_option(OPTION_SET_META_CONTEXT, &meta_payload(DISK, &[META_CONTEXT_BASE_ALLOCATION]));
    conn.expect_option_reply(OPTION_SET_META_CONTEXT, REPLY_ERROR_INVALID);
    conn.send_option(OPTION_LIST_META_CONTEXT, &meta_payload(DISK, &[]));
    conn.expect_option_reply(OPTION_LIST_META_CONTEXT, REPLY_ERROR_INVALID);

    // Payloads over the bound are read, dropped and refused.
    for length in [OPTION_PAYLOAD_MAXIMUM_BYTES + 1, 100 << 10] {
        let mut bytes = option_header(OPTION_GO, length);
        bytes.extend(pattern(length as u64, length as usize));
        conn.send(&bytes);
        conn.expect_option_reply(OPTION_GO, REPLY_ERROR_TOO_BIG);
    }

    // Still in step: LIST names both exports.
    conn.send_option(OPTION_LIST, &[]);
    for (name, description) in [(DISK, DISK_DESCRIPTION), (READ_ONLY, READ_ONLY_DESCRIPTION)] {
        let entry = conn.expect_option_reply(OPTION_LIST, REPLY_SERVER);
        let name_length = be32(&entry[0..4]) as usize;
        assert_eq!(&entry[4..4 + name_length], name.as_bytes());
        assert_eq!(&entry[4 + name_length..], description.as_bytes());
    }
    assert!(conn.expect_option_reply(OPTION_LIST, REPLY_ACK).is_empty());

    // Structured replies once, not twice; then meta contexts work.
    conn.send_option(OPTION_STRUCTURED_REPLY, &[]);
    conn.expect_option_reply(OPTION_STRUCTURED_REPLY, REPLY_ACK);
    conn.send_option(OPTION_STRUCTURED_REPLY, &[]);
    conn.expect_option_reply(OPTION_STRUCTURED_REPLY, REPLY_ERROR_INVALID);
    conn.send_option(OPTION_LIST_META_CONTEXT, &meta_payload(DISK, &[]));
    let context = conn.expect_option_reply(OPTION_LIST_META_CONTEXT, REPLY_META_CONTEXT);
    assert_eq!(&context[4..], META_CONTEXT_BASE_ALLOCATION.as_bytes());
    conn.expect_option_reply(OPTION_LIST_META_CONTEXT, REPLY_ACK);
    conn.send_option(OPTION_SET_META_CONTEXT, &meta_payload(DISK, &["x-other:thing"]));
    conn.expect_option_reply(OPTION_SET_META_CONTEXT, REPLY_ACK);
    conn.send_option(OPTION_SET_META_CONTEXT, &meta_payload("nope", &[META_CONTEXT_BASE_ALLOCATION]));
    conn.expect_option_reply(OPTION_SET_META_CONTEXT, REPLY_ERROR_UNKNOWN);
    let info = conn.go(OPTION_INFO, READ_ONLY, &[]).unwrap_or_else(|error| panic!("{}", error.describe()));
    assert_eq!((info.size, info.flags), (Some(fixture.size), READ_ONLY_FLAGS));

    // ABORT: an ACK, then the server closes.
    conn.send_option(OPTION_ABORT, &[]);
    assert!(conn.expect_option_reply(OPTION_ABORT, REPLY_ACK).is_empty());
    assert!(conn.expect_dropped("after NBD_OPT_ABORT").is_empty());

    // Option payloads beyond every limit: the server closes without reading them (we
    // never send them) and so without buffering them.
    for length in [u32::MAX, DISCARD_LIMIT_BYTES + 1] {
        let mut conn = Conn::open(&fixture);
        conn.start(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES);
        conn.send(&option_header(OPTION_GO, length));
        conn.expect_dropped(&format!("option payload of {length} bytes"));
    }

    // A bad option magic, a client that is not fixed newstyle, unknown client flags, and
    // EXPORT_NAME of an unknown export: the server closes.
    let mut conn = Conn::open(&fixture);
    conn.start(CLIENT_FLAG_FIXED_NEWSTYLE);
    let mut header = option_header(OPTION_LIST, 0);
    header[0] ^= 0x80;
    conn.send(&header);
    conn.expect_dropped("bad option magic");
    for flags in [0, CLIENT_FLAG_FIXED_NEWSTYLE | 1 << 7] {
        let mut conn = Conn::open(&fixture);
        conn.start(flags);
        conn.expect_dropped(&format!("client flags {flags:#x}"));
    }
    let mut conn = Conn::open(&fixture);
    conn.start(CLIENT_FLAG_FIXED_NEWSTYLE);
    conn.send_option(OPTION_EXPORT_NAME, b"nope");
    assert!(conn.expect_dropped("EXPORT_NAME of an unknown export").is_empty());

    // The server still serves.
    let mut conn = fixture.connect_structured(DISK, true);
    conn.read(0, BLOCK as u32).assert_data(0, &[0u8; BLOCK as usize]);
    conn.disconnect();
}

/// NBD_OPT_EXPORT_NAME has no option reply: the only answers are the export's size and
/// flags, or closing the connection (proto.md: "If the chosen export does not exist or
/// requirements for the chosen export are not met ..., the server MUST terminate the
/// session"). A name the server cannot parse must therefore close the connection too.
#[test]
fn export_name_that_cannot_be_parsed_closes_the_connection() {
    let fixture = Fixture::new();
    let too_long = vec![b'a'; 5000];
    let too_big = vec![b'a'; OPTION_PAYLOAD_MAXIMUM_BYTES as usize + 1];
    let mut failures = Vec::new();
    for (what, name) in [("non-UTF-8", &[0xFF, 0xFE][..]), ("5000-byte", &too_long[..]), ("65537-byte", &too_big[..])] {
        let mut conn = Conn::open(&fixture);
        conn.start(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES);
        // The server may close as soon as it sees the announced length, before the
        // payload is sent: a refused send is that close, not a failure.
        let mut bytes = option_header(OPTION_EXPORT_NAME, name.len() as u32);
        bytes.extend_from_slice(name);
        let _ = conn.stream.write_all(&bytes);
        conn.stream.set_read_timeout(Some(PROMPTLY)).expect("read timeout");
        let mut received = Vec::new();
        let mut buffer = [0u8; 4096];
        let closed = loop {
            match conn.stream.read(&mut buffer) {
                Ok(0) => break true,
                Ok(count) => received.extend_from_slice(&buffer[..count]),
                Err(error) if error.kind() == ErrorKind::ConnectionReset => break true,
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(_) => break false,
            }
        };
        if !closed || !received.is_empty() {
            failures.push(format!(
                "EXPORT_NAME with a {what} name: connection {} after the server sent {} bytes {:02x?}",
                if closed { "closed" } else { "still open" },
                received.len(),
                &received[..received.len().min(24)]
            ));
        }
        if closed {
            conn.wait_served(what);
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

// ---------------------------------------------------------------------------------------
// 4. Transmission errors.

#[test]
fn transmission_errors_keep_the_stream_in_step() {
    let fixture = Fixture::new();
    let size = fixture.size;
    let mut conn = fixture.connect_structured(DISK, true);
    let data = pattern(4, 8 * KIB as usize);
    conn.write(0, &data).assert_done();
    let check = |conn: &mut Conn| conn.read(0, data.len() as u32).assert_data(0, &data);

    // Beyond the end.
    conn.read(size - BLOCK, 2 * BLOCK as u32).assert_error(ERROR_INVALID);
    conn.read(size, 512).assert_error(ERROR_INVALID);
    conn.write(size - BLOCK, &data).assert_error(WRITE_PAST_THE_END); // the payload is consumed
    check(&mut conn);
    conn.call(0, COMMAND_TRIM, size - BLOCK, 2 * BLOCK as u32, &[]).assert_error(ERROR_INVALID);
    conn.call(0, COMMAND_WRITE_ZEROES, size, BLOCK as u32, &[]).assert_error(WRITE_PAST_THE_END);
    conn.call(0, COMMAND_BLOCK_STATUS, size - BLOCK, 2 * BLOCK as u32, &[]).assert_error(ERROR_INVALID);
    conn.call(0, COMMAND_CACHE, size, BLOCK as u32, &[]).assert_error(ERROR_INVALID);
    check(&mut conn);

    // offset + length overflows u64.
    let near_end = u64::MAX - 511;
    conn.read(near_end, 4096).assert_error(ERROR_INVALID);
    conn.write(near_end, &data).assert_error(WRITE_PAST_THE_END);
    conn.call(0, COMMAND_TRIM, near_end, 4096, &[]).assert_error(ERROR_INVALID);
    conn.call(0, COMMAND_WRITE_ZEROES, near_end, 4096, &[]).assert_error(WRITE_PAST_THE_END);
    conn.call(0, COMMAND_BLOCK_STATUS, u64::MAX, u32::MAX, &[]).assert_error(ERROR_INVALID);
    check(&mut conn);

    // Unknown commands (no payload is read for them) and unknown flag bits (the payload
    // of a write is still read).
    conn.call(0, 200, 0, 4096, &[]).assert_error(ERROR_INVALID);
    conn.call(0, u16::MAX, 0, 0, &[]).assert_error(ERROR_INVALID);
    conn.call(1 << 7, COMMAND_READ, 0, 4096, &[]).assert_error(ERROR_INVALID);
    conn.call(1 << 15, COMMAND_WRITE, 0, data.len() as u32, &pattern(5, data.len())).assert_error(ERROR_INVALID);
    check(&mut conn);

    // Unaligned ranges (the engine works in 512-byte sectors) are refused, not fatal.
    conn.read(1, 512).assert_error(ERROR_INVALID);
    conn.write(512, &[1u8; 100]).assert_error(ERROR_INVALID);
    check(&mut conn);

    // Reads larger than the maximum block size.
    conn.read(0, 64 << 20).assert_error(OVER_THE_MAXIMUM);
    conn.read(0, u32::MAX).assert_error(OVER_THE_MAXIMUM);
    check(&mut conn);

    // The read-only export: writes are EPERM, their payload is consumed.
    let mut read_only = fixture.connect_structured(READ_ONLY, true);
    assert_eq!(read_only.transmission_flags, READ_ONLY_FLAGS);
    read_only.write(0, &pattern(6, data.len())).assert_error(ERROR_PERMISSION);
    read_only.read(0, data.len() as u32).assert_data(0, &data);
    read_only
        .call(COMMAND_FLAG_FUA, COMMAND_WRITE, BLOCK, BLOCK as u32, &[9u8; BLOCK as usize])
        .assert_error(ERROR_PERMISSION);
    read_only.call(0, COMMAND_TRIM, 0, BLOCK as u32, &[]).assert_error(ERROR_PERMISSION);
    read_only.call(COMMAND_FLAG_NO_HOLE, COMMAND_WRITE_ZEROES, 0, BLOCK as u32, &[]).assert_error(ERROR_PERMISSION);
    read_only.call(0, COMMAND_FLUSH, 0, 0, &[]).assert_done();
    assert_eq!(
        read_only.block_status(0, 0, 2 * data.len() as u32),
        [(data.len() as u32, 0), (data.len() as u32, HOLE)]
    );
    read_only.read(0, data.len() as u32).assert_data(0, &data);

    // A write announcing a 4 GiB payload: the server hangs up without waiting for (or
    // buffering) the payload; the other connections carry on.
    let mut greedy = fixture.connect_structured(DISK, false);
    let cookie = greedy.cookie();
    greedy.send_request(0, COMMAND_WRITE, cookie, 0, u32::MAX, &[]);
    greedy.expect_dropped("WRITE announcing a 4 GiB payload");
    check(&mut conn);
    read_only.read(0, data.len() as u32).assert_data(0, &data);

    // A bad request magic: the server hangs up.
    let mut garbled = fixture.connect_structured(DISK, false);
    let mut header = codec::encode_request(&Request {
        flags: 0,
        command: COMMAND_READ,
        cookie: 1,
        offset_bytes: 0,
        length_bytes: 512,
    });
    header[3] ^= 1;
    garbled.send(&header);
    garbled.expect_dropped("bad request magic");

    check(&mut conn);
    conn.disconnect();
    read_only.disconnect();
    let mut fresh = fixture.connect_export_name(DISK, true);
    fresh.read(0, data.len() as u32).assert_data(0, &data);
    fresh.disconnect();
}

/// proto.md: an NBD_REPLY_TYPE_OFFSET_DATA chunk's "*length* MUST be at least 9" (each
/// content chunk "MUST describe at least one byte"), and an NBD_REPLY_TYPE_BLOCK_STATUS
/// chunk's "*length* MUST be 4 + (a positive integer multiple of 8)" ("the server MUST
/// return at least one status descriptor"). Whatever a server makes of zero-length
/// requests, the chunks it sends must be well formed (a client may hard-disconnect on an
/// invalid chunk): a zero-length READ may be answered with NBD_REPLY_TYPE_NONE or an error,
/// a zero-length BLOCK_STATUS only with an error.
#[test]
fn zero_length_requests_get_well_formed_replies() {
    let fixture = Fixture::new();
    let mut conn = fixture.connect_structured(DISK, true);
    let mut failures = Vec::new();
    let read = conn.read(0, 0);
    if !matches!(read.chunk, Some(CHUNK_NONE) | Some(CHUNK_ERROR)) {
        failures.push(format!("zero-length READ answered with {}", read.describe()));
    }
    let status = conn.call(0, COMMAND_BLOCK_STATUS, 0, 0, &[]);
    if status.chunk != Some(CHUNK_ERROR) {
        failures.push(format!("zero-length BLOCK_STATUS answered with {}", status.describe()));
    }
    conn.read(0, 512).assert_data(0, &[0u8; 512]);
    conn.disconnect();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Zero-length requests that have a well-formed answer do not upset the server.
#[test]
fn zero_length_writes_and_simple_reads_are_harmless() {
    let fixture = Fixture::new();
    let mut conn = fixture.connect_structured(DISK, true);
    conn.write(0, &[]).assert_done();
    conn.call(0, COMMAND_TRIM, 0, 0, &[]).assert_done();
    conn.call(COMMAND_FLAG_NO_HOLE, COMMAND_WRITE_ZEROES, fixture.size, 0, &[]).assert_done();
    conn.call(0, COMMAND_CACHE, 0, 0, &[]).assert_done();
    conn.read(0, 512).assert_data(0, &[0u8; 512]);
    conn.disconnect();
    let mut conn = fixture.connect_export_name(DISK, true);
    conn.read(0, 0).assert_data(0, &[]);
    conn.read(0, 512).assert_data(0, &[0u8; 512]);
    conn.disconnect();
}

// ---------------------------------------------------------------------------------------
// 6. Memory bound: write payloads are never buffered beyond MAXIMUM_REQUEST_BYTES.

#[test]
fn write_payloads_are_bounded_by_the_maximum_request_size() {
    let fixture = Fixture::new();
    let maximum = MAXIMUM_REQUEST_BYTES as usize;
    // The helper checked that GO advertises MAXIMUM_REQUEST_BYTES as the maximum block size.
    let mut conn = fixture.connect_structured(DISK, true);

    // Exactly the maximum is served.
    let data = pattern(7, maximum);
    conn.write(0, &data).assert_done();
    conn.read(0, maximum as u32).assert_data(0, &data);

    // One sector more is refused; the payload is skipped (never stored,
    // never buffered whole) and the stream stays in step.
    let larger = pattern(8, maximum + 512);
    conn.write(0, &larger).assert_error(OVER_THE_MAXIMUM);
    conn.read(0, maximum as u32).assert_data(0, &data);
    conn.read(0, MAXIMUM_REQUEST_BYTES + 512).assert_error(OVER_THE_MAXIMUM);

    // Up to the discard limit the payload is still skipped politely; refusals decided
    // before the size (read-only) skip it too.
    let at_limit = vec![0x5Au8; DISCARD_LIMIT_BYTES as usize];
    conn.write(MIB, &at_limit).assert_error(OVER_THE_MAXIMUM);
    conn.read(0, maximum as u32).assert_data(0, &data);
    let mut read_only = fixture.connect_structured(READ_ONLY, false);
    read_only.write(0, &larger).assert_error(ERROR_PERMISSION);
    read_only.read(0, 4096).assert_data(0, &data[..4096]);
    read_only.disconnect();

    // Beyond it the server hangs up at once instead of reading (let alone buffering) the
    // payload: we never send it.
    for length in [DISCARD_LIMIT_BYTES + 1, u32::MAX] {
        let mut greedy = fixture.connect_structured(DISK, false);
        let cookie = greedy.cookie();
        greedy.send_request(0, COMMAND_WRITE, cookie, 0, length, &[]);
        greedy.expect_dropped(&format!("WRITE announcing {length} bytes"));
    }
    conn.read(0, maximum as u32).assert_data(0, &data);
    conn.disconnect();
}

// ---------------------------------------------------------------------------------------
// 5. Random bytes.

/// Bytes at the start of the export written before the random sessions and checked after.
const PROTECTED_BYTES: u64 = 256 * KIB;
const RANDOM_SEEDS: u64 = 201;

#[test]
fn random_bytes_never_break_the_server() {
    let fixture = Fixture::new();
    let protected = pattern(0xC0FFEE, PROTECTED_BYTES as usize);
    let mut conn = fixture.connect_structured(DISK, true);
    conn.call(COMMAND_FLAG_FUA, COMMAND_WRITE, 0, PROTECTED_BYTES as u32, &protected).assert_done();
    conn.disconnect();

    let started = Instant::now();
    for seed in 0..RANDOM_SEEDS {
        let mut prng = Prng::new(seed);
        let what = format!("seed {seed}");
        match seed % 3 {
            0 => {
                // (a) random bytes right away (the greeting is not even read).
                let conn = Conn::open(&fixture);
                let bytes = random_bytes(&mut prng, 2048);
                spew(conn, &bytes, &what);
            }
            1 => {
                // (b) a valid answer to the greeting, then random bytes or random options.
                let conn = Conn::open(&fixture);
                let bytes = random_handshake(&mut prng);
                spew(conn, &bytes, &what);
            }
            _ => {
                // (c) a complete handshake, then random bytes or random requests.
                let conn = match prng.below(4) {
                    0 => fixture.connect_export_name(DISK, prng.chance(1, 2)),
                    1 => fixture.connect_structured(READ_ONLY, prng.chance(1, 2)),
                    2 => fixture.connect_go_simple(DISK),
                    _ => fixture.connect_structured(DISK, true),
                };
                let bytes = random_requests(&mut prng, fixture.size);
                spew(conn, &bytes, &what);
            }
        }
        if seed % 50 == 49 {
            check_intact(&fixture, &protected);
        }
    }
    check_intact(&fixture, &protected);
    let statistics = &fixture.server.statistics;
    let (requests, errors) = (statistics.requests.load(Relaxed), statistics.errors.load(Relaxed));
    eprintln!("{RANDOM_SEEDS} random sessions in {:?}: {requests} requests, {errors} errors", started.elapsed());
    // The random requests did reach the volume, and were not all refused.
    assert!(requests >= 100 && errors >= 50 && requests - errors >= 20, "{requests} requests, {errors} errors");
}

/// Send `bytes` (reading whatever comes back meanwhile), half-close, and check that the
/// server ends the connection and `serve()` returns without a panic.
fn spew(mut conn: Conn, bytes: &[u8], what: &str) {
    let mut reader = conn.stream.try_clone().expect("clone the client socket");
    let drainer = std::thread::spawn(move || {
        let mut buffer = vec![0u8; 256 << 10];
        loop {
            match reader.read(&mut buffer) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) if error.kind() == ErrorKind::ConnectionReset => return true,
                Err(_) => return false, // timed out: the server did not close
            }
        }
    });
    // The server may close before taking everything: that is an answer too.
    let _ = conn.stream.write_all(bytes);
    let _ = conn.stream.shutdown(Shutdown::Write);
    conn.wait_served(what);
    assert!(drainer.join().expect("drainer"), "{what}: the connection was not closed");
}

/// A valid answer to the greeting, then random bytes or a run of options with the right
/// magic and random numbers, lengths and payloads.
fn random_handshake(prng: &mut Prng) -> Vec<u8> {
    let flags = if prng.chance(1, 2) { CLIENT_FLAG_FIXED_NEWSTYLE } else { 3 };
    let mut bytes = flags.to_be_bytes().to_vec();
    if prng.chance(1, 3) {
        bytes.extend(random_bytes(prng, 2048));
        return bytes;
    }
    let names = [DISK, READ_ONLY, "", "nope", "disk\u{0}"];
    for _ in 0..1 + prng.below(6) {
        let option = if prng.chance(1, 5) { prng.next_u64() as u32 } else { prng.below(12) as u32 };
        let name = names[prng.below(names.len() as u64) as usize];
        let mut payload = match prng.below(5) {
            0 => random_bytes(prng, 64),
            1 => go_payload(name, &[prng.below(5) as u16, prng.next_u64() as u16]),
            2 => meta_payload(name, &[META_CONTEXT_BASE_ALLOCATION, "base:", ""][..prng.below(4) as usize]),
            3 => name.as_bytes().to_vec(),
            _ => Vec::new(),
        };
        if !payload.is_empty() && prng.chance(1, 4) {
            let at = prng.below(payload.len() as u64) as usize;
            payload[at] ^= 1 << prng.below(8);
        }
        let length = match prng.below(10) {
            0 => prng.next_u64() as u32,
            1 => (payload.len() as u64 + prng.below(32)) as u32,
            2 => (payload.len() as u64).saturating_sub(prng.below(8)) as u32,
            3 => (64 * KIB + prng.below(MIB)) as u32,
            _ => payload.len() as u32,
        };
        let mut header = option_header(option, length);
        if prng.chance(1, 12) {
            header[prng.below(8) as usize] ^= 0x10;
        }
        bytes.extend(header);
        bytes.extend(payload);
    }
    if prng.chance(1, 2) {
        bytes.extend(random_bytes(prng, 512));
    }
    bytes
}

/// After the handshake: random bytes, or requests with the right magic and random flags,
/// commands, ranges and payloads. Ranges start at or beyond `PROTECTED_BYTES` so that the
/// data written before stays as it was.
fn random_requests(prng: &mut Prng, size: u64) -> Vec<u8> {
    if prng.chance(1, 3) {
        return random_bytes(prng, 4096);
    }
    let mut bytes = Vec::new();
    for _ in 0..1 + prng.below(8) {
        let flags = if prng.chance(1, 4) { prng.next_u64() as u16 } else { prng.below(32) as u16 };
        let mut command = if prng.chance(1, 8) { prng.next_u64() as u16 } else { prng.below(9) as u16 };
        if command == COMMAND_DISCONNECT && prng.chance(3, 4) {
            command = COMMAND_READ;
        }
        let mut offset = match prng.below(5) {
            0 => prng.next_u64(),
            1 => u64::MAX - prng.below(MIB),
            2 => size - prng.below(MIB),
            _ => PROTECTED_BYTES + prng.below(size - PROTECTED_BYTES),
        };
        if prng.chance(3, 4) {
            offset &= !511;
        }
        if offset < PROTECTED_BYTES {
            offset += PROTECTED_BYTES;
        }
        let mut length = match prng.below(6) {
            0 => prng.next_u64() as u32,
            1 => prng.below(MAXIMUM_REQUEST_BYTES as u64 + 2 * MIB) as u32,
            _ => prng.below(64 * KIB) as u32,
        };
        if prng.chance(3, 4) {
            length &= !511;
        }
        let request = Request { flags, command, cookie: prng.next_u64(), offset_bytes: offset, length_bytes: length };
        bytes.extend_from_slice(&codec::encode_request(&request));
        if command == COMMAND_WRITE {
            let mut payload = vec![0u8; (length as usize).min(64 << 10)];
            prng.fill(&mut payload);
            bytes.extend(payload);
        }
        if prng.chance(1, 20) {
            bytes.extend(random_bytes(prng, 64));
        }
    }
    bytes
}

/// A fresh, well-behaved connection: the protected data is intact and writes still work.
fn check_intact(fixture: &Fixture, protected: &[u8]) {
    let mut conn = fixture.connect_structured(DISK, true);
    conn.read(0, protected.len() as u32).assert_data(0, protected);
    let scratch = fixture.size - 64 * KIB;
    let data = pattern(scratch, 8 * KIB as usize);
    conn.call(COMMAND_FLAG_FUA, COMMAND_WRITE, scratch, data.len() as u32, &data).assert_done();
    conn.read(scratch, data.len() as u32).assert_data(scratch, &data);
    conn.disconnect();
}
