//! The NBD wire format without I/O: parse what a client sends (validating every field
//! once, here at the edge) and build what the server sends. The server reads exactly the
//! number of bytes these functions ask for; nothing here allocates more than a bounded
//! size chosen by the caller.

use crate::protocol::*;

/// Longest option payload accepted (names and meta-context queries are at most 4 KiB
/// each in the protocol; a few of them fit).
pub const OPTION_PAYLOAD_MAXIMUM_BYTES: u32 = 64 << 10;
/// Longest string (export name, query) accepted inside an option.
pub const STRING_MAXIMUM_BYTES: u32 = 4096;
/// Size of a request header on the wire.
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Size of an option header on the wire (after the client flags).
pub const OPTION_HEADER_BYTES: usize = 16;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("bad magic {0:#x}")]
    BadMagic(u64),
    #[error("option payload of {0} bytes is larger than {OPTION_PAYLOAD_MAXIMUM_BYTES}")]
    OptionTooLarge(u32),
    #[error("malformed option {option}: {reason}")]
    MalformedOption { option: u32, reason: String },
    #[error("client does not speak fixed newstyle (flags {0:#x})")]
    NotFixedNewstyle(u32),
    #[error("unknown client flags {0:#x}")]
    UnknownClientFlags(u32),
}

/// The 18 bytes the server opens with.
pub fn server_greeting() -> Vec<u8> {
    let mut bytes = Vec::with_capacity(18);
    bytes.extend_from_slice(&NBDMAGIC.to_be_bytes());
    bytes.extend_from_slice(&IHAVEOPT.to_be_bytes());
    bytes.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    bytes
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientFlags {
    pub no_zeroes: bool,
}

pub fn parse_client_flags(bytes: [u8; 4]) -> Result<ClientFlags, ProtocolError> {
    let flags = u32::from_be_bytes(bytes);
    if flags & CLIENT_FLAG_FIXED_NEWSTYLE == 0 {
        return Err(ProtocolError::NotFixedNewstyle(flags));
    }
    if flags & !(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES) != 0 {
        return Err(ProtocolError::UnknownClientFlags(flags));
    }
    Ok(ClientFlags { no_zeroes: flags & CLIENT_FLAG_NO_ZEROES != 0 })
}

/// An option header: which option, and how many payload bytes follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

/// Parse an option header. A payload longer than the bound is an error the server
/// answers by discarding the payload (bounded reads) or disconnecting.
pub fn parse_option_header(bytes: &[u8; OPTION_HEADER_BYTES]) -> Result<OptionHeader, ProtocolError> {
    let magic = u64::from_be_bytes(bytes[0..8].try_into().expect("8 bytes"));
    if magic != IHAVEOPT {
        return Err(ProtocolError::BadMagic(magic));
    }
    let option = u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes"));
    let length = u32::from_be_bytes(bytes[12..16].try_into().expect("4 bytes"));
    Ok(OptionHeader { option, length })
}

/// What a client asked for in the handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OptionRequest {
    ExportName { name: String },
    Abort,
    List,
    StartTls,
    Info { name: String, information: Vec<u16> },
    Go { name: String, information: Vec<u16> },
    StructuredReply,
    ListMetaContext { name: String, queries: Vec<String> },
    SetMetaContext { name: String, queries: Vec<String> },
    Unknown { option: u32 },
}

struct Reader<'a> {
    bytes: &'a [u8],
    option: u32,
}

impl Reader<'_> {
    fn malformed(&self, reason: &str) -> ProtocolError {
        ProtocolError::MalformedOption { option: self.option, reason: reason.to_string() }
    }

    fn take(&mut self, count: usize) -> Result<&[u8], ProtocolError> {
        if self.bytes.len() < count {
            return Err(self.malformed("payload too short"));
        }
        let (head, tail) = self.bytes.split_at(count);
        self.bytes = tail;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, ProtocolError> {
        Ok(u16::from_be_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }

    fn u32(&mut self) -> Result<u32, ProtocolError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    /// A string with a 32-bit length prefix.
    fn string(&mut self) -> Result<String, ProtocolError> {
        let length = self.u32()?;
        if length > STRING_MAXIMUM_BYTES {
            return Err(self.malformed("string longer than 4096 bytes"));
        }
        let bytes = self.take(length as usize)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| self.malformed("string is not UTF-8"))
    }

    fn finish(&self) -> Result<(), ProtocolError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(self.malformed("trailing bytes"))
        }
    }
}

/// Parse an option's payload (already read, at most `OPTION_PAYLOAD_MAXIMUM_BYTES`).
pub fn parse_option(option: u32, payload: &[u8]) -> Result<OptionRequest, ProtocolError> {
    let mut reader = Reader { bytes: payload, option };
    let request = match option {
        OPTION_EXPORT_NAME => {
            if payload.len() > STRING_MAXIMUM_BYTES as usize {
                return Err(reader.malformed("export name longer than 4096 bytes"));
            }
            let name = String::from_utf8(payload.to_vec()).map_err(|_| reader.malformed("name is not UTF-8"))?;
            return Ok(OptionRequest::ExportName { name });
        }
        OPTION_ABORT | OPTION_LIST | OPTION_STRUCTURED_REPLY | OPTION_STARTTLS => {
            reader.finish()?;
            match option {
                OPTION_ABORT => OptionRequest::Abort,
                OPTION_LIST => OptionRequest::List,
                OPTION_STARTTLS => OptionRequest::StartTls,
                _ => OptionRequest::StructuredReply,
            }
        }
        OPTION_INFO | OPTION_GO => {
            let name = reader.string()?;
            let count = reader.u16()?;
            let mut information = Vec::with_capacity(count.min(64) as usize);
            for _ in 0..count {
                information.push(reader.u16()?);
            }
            reader.finish()?;
            if option == OPTION_INFO {
                OptionRequest::Info { name, information }
            } else {
                OptionRequest::Go { name, information }
            }
        }
        OPTION_LIST_META_CONTEXT | OPTION_SET_META_CONTEXT => {
            let name = reader.string()?;
            let count = reader.u32()?;
            let mut queries = Vec::new();
            for _ in 0..count {
                queries.push(reader.string()?);
            }
            reader.finish()?;
            if option == OPTION_LIST_META_CONTEXT {
                OptionRequest::ListMetaContext { name, queries }
            } else {
                OptionRequest::SetMetaContext { name, queries }
            }
        }
        other => OptionRequest::Unknown { option: other },
    };
    Ok(request)
}

/// An option reply: header and payload.
pub fn option_reply(option: u32, reply: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(20 + payload.len());
    bytes.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&reply.to_be_bytes());
    bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

pub fn reply_server_entry(option: u32, name: &str, description: &str) -> Vec<u8> {
    let mut payload = Vec::new();
    payload.extend_from_slice(&(name.len() as u32).to_be_bytes());
    payload.extend_from_slice(name.as_bytes());
    payload.extend_from_slice(description.as_bytes());
    option_reply(option, REPLY_SERVER, &payload)
}

pub fn reply_info_export(option: u32, size_bytes: u64, transmission_flags: u16) -> Vec<u8> {
    let mut payload = Vec::with_capacity(12);
    payload.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    payload.extend_from_slice(&size_bytes.to_be_bytes());
    payload.extend_from_slice(&transmission_flags.to_be_bytes());
    option_reply(option, REPLY_INFO, &payload)
}

pub fn reply_info_text(option: u32, information: u16, text: &str) -> Vec<u8> {
    let mut payload = Vec::with_capacity(2 + text.len());
    payload.extend_from_slice(&information.to_be_bytes());
    payload.extend_from_slice(text.as_bytes());
    option_reply(option, REPLY_INFO, &payload)
}

pub fn reply_info_block_size(option: u32, minimum: u32, preferred: u32, maximum: u32) -> Vec<u8> {
    let mut payload = Vec::with_capacity(14);
    payload.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    payload.extend_from_slice(&minimum.to_be_bytes());
    payload.extend_from_slice(&preferred.to_be_bytes());
    payload.extend_from_slice(&maximum.to_be_bytes());
    option_reply(option, REPLY_INFO, &payload)
}

pub fn reply_meta_context(option: u32, context_id: u32, name: &str) -> Vec<u8> {
    let mut payload = Vec::with_capacity(4 + name.len());
    payload.extend_from_slice(&context_id.to_be_bytes());
    payload.extend_from_slice(name.as_bytes());
    option_reply(option, REPLY_META_CONTEXT, &payload)
}

pub fn reply_error(option: u32, error: u32, message: &str) -> Vec<u8> {
    option_reply(option, error, message.as_bytes())
}

/// What NBD_OPT_EXPORT_NAME ends with: size, flags and (unless NO_ZEROES) 124 zeros.
pub fn export_name_reply(size_bytes: u64, transmission_flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(134);
    bytes.extend_from_slice(&size_bytes.to_be_bytes());
    bytes.extend_from_slice(&transmission_flags.to_be_bytes());
    if !no_zeroes {
        bytes.extend_from_slice(&[0u8; 124]);
    }
    bytes
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset_bytes: u64,
    pub length_bytes: u32,
}

pub fn parse_request(bytes: &[u8; REQUEST_HEADER_BYTES]) -> Result<Request, ProtocolError> {
    let magic = u32::from_be_bytes(bytes[0..4].try_into().expect("4 bytes"));
    if magic != REQUEST_MAGIC {
        return Err(ProtocolError::BadMagic(magic as u64));
    }
    Ok(Request {
        flags: u16::from_be_bytes(bytes[4..6].try_into().expect("2 bytes")),
        command: u16::from_be_bytes(bytes[6..8].try_into().expect("2 bytes")),
        cookie: u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes")),
        offset_bytes: u64::from_be_bytes(bytes[16..24].try_into().expect("8 bytes")),
        length_bytes: u32::from_be_bytes(bytes[24..28].try_into().expect("4 bytes")),
    })
}

pub fn encode_request(request: &Request) -> [u8; REQUEST_HEADER_BYTES] {
    let mut bytes = [0u8; REQUEST_HEADER_BYTES];
    bytes[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    bytes[4..6].copy_from_slice(&request.flags.to_be_bytes());
    bytes[6..8].copy_from_slice(&request.command.to_be_bytes());
    bytes[8..16].copy_from_slice(&request.cookie.to_be_bytes());
    bytes[16..24].copy_from_slice(&request.offset_bytes.to_be_bytes());
    bytes[24..28].copy_from_slice(&request.length_bytes.to_be_bytes());
    bytes
}

/// A simple reply header (read data, if any, follows).
pub fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    bytes[4..8].copy_from_slice(&error.to_be_bytes());
    bytes[8..16].copy_from_slice(&cookie.to_be_bytes());
    bytes
}

/// A structured reply chunk header; `length` payload bytes follow.
pub fn structured_header(flags: u16, chunk_type: u16, cookie: u64, length: u32) -> [u8; 20] {
    let mut bytes = [0u8; 20];
    bytes[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    bytes[4..6].copy_from_slice(&flags.to_be_bytes());
    bytes[6..8].copy_from_slice(&chunk_type.to_be_bytes());
    bytes[8..16].copy_from_slice(&cookie.to_be_bytes());
    bytes[16..20].copy_from_slice(&length.to_be_bytes());
    bytes
}

/// An error chunk (final), with a message.
pub fn structured_error(cookie: u64, error: u32, message: &str) -> Vec<u8> {
    let message = &message.as_bytes()[..message.len().min(1024)];
    let mut bytes = structured_header(REPLY_FLAG_DONE, CHUNK_ERROR, cookie, 6 + message.len() as u32).to_vec();
    bytes.extend_from_slice(&error.to_be_bytes());
    bytes.extend_from_slice(&(message.len() as u16).to_be_bytes());
    bytes.extend_from_slice(message);
    bytes
}

/// A block-status chunk (final): context id and (length, flags) extents.
pub fn structured_block_status(cookie: u64, context_id: u32, extents: &[(u32, u32)]) -> Vec<u8> {
    let length = 4 + 8 * extents.len() as u32;
    let mut bytes = structured_header(REPLY_FLAG_DONE, CHUNK_BLOCK_STATUS, cookie, length).to_vec();
    bytes.extend_from_slice(&context_id.to_be_bytes());
    for (extent_length, flags) in extents {
        bytes.extend_from_slice(&extent_length.to_be_bytes());
        bytes.extend_from_slice(&flags.to_be_bytes());
    }
    bytes
}

// The client's side (used by the benchmark's NBD client).

/// An option request as a client sends it: IHAVEOPT, option, payload length, payload.
pub fn option_request(option: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(OPTION_HEADER_BYTES + payload.len());
    bytes.extend_from_slice(&IHAVEOPT.to_be_bytes());
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// Size of an option reply header on the wire.
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;

/// An option reply header: which option it answers, the reply type, the payload length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply: u32,
    pub length_bytes: u32,
}

pub fn parse_option_reply_header(bytes: &[u8; OPTION_REPLY_HEADER_BYTES]) -> Result<OptionReplyHeader, ProtocolError> {
    let magic = u64::from_be_bytes(bytes[0..8].try_into().expect("8 bytes"));
    if magic != OPTION_REPLY_MAGIC {
        return Err(ProtocolError::BadMagic(magic));
    }
    let length_bytes = u32::from_be_bytes(bytes[16..20].try_into().expect("4 bytes"));
    if length_bytes > OPTION_PAYLOAD_MAXIMUM_BYTES {
        return Err(ProtocolError::OptionTooLarge(length_bytes));
    }
    Ok(OptionReplyHeader {
        option: u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes")),
        reply: u32::from_be_bytes(bytes[12..16].try_into().expect("4 bytes")),
        length_bytes,
    })
}

/// A simple reply header: (error, cookie).
pub fn parse_simple_reply(bytes: &[u8; 16]) -> Result<(u32, u64), ProtocolError> {
    let magic = u32::from_be_bytes(bytes[0..4].try_into().expect("4 bytes"));
    if magic != SIMPLE_REPLY_MAGIC {
        return Err(ProtocolError::BadMagic(magic as u64));
    }
    Ok((
        u32::from_be_bytes(bytes[4..8].try_into().expect("4 bytes")),
        u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn string_field(text: &str) -> Vec<u8> {
        let mut bytes = (text.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(text.as_bytes());
        bytes
    }

    #[test]
    fn go_and_meta_context_payloads_parse() {
        let mut go = string_field("disk");
        go.extend_from_slice(&2u16.to_be_bytes());
        go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        go.extend_from_slice(&INFO_NAME.to_be_bytes());
        assert_eq!(
            parse_option(OPTION_GO, &go),
            Ok(OptionRequest::Go { name: "disk".into(), information: vec![INFO_BLOCK_SIZE, INFO_NAME] })
        );
        let mut meta = string_field("disk");
        meta.extend_from_slice(&1u32.to_be_bytes());
        meta.extend_from_slice(&string_field("base:allocation"));
        assert_eq!(
            parse_option(OPTION_SET_META_CONTEXT, &meta),
            Ok(OptionRequest::SetMetaContext { name: "disk".into(), queries: vec!["base:allocation".into()] })
        );
        assert_eq!(parse_option(OPTION_EXPORT_NAME, b"x"), Ok(OptionRequest::ExportName { name: "x".into() }));
        assert_eq!(parse_option(99, b"whatever"), Ok(OptionRequest::Unknown { option: 99 }));
    }

    #[test]
    fn malformed_options_are_errors() {
        let cases: &[(u32, Vec<u8>)] = &[
            (OPTION_GO, vec![0, 0, 0, 9, b'a']),                   // name longer than payload
            (OPTION_GO, [string_field("a"), vec![0, 1]].concat()), // count 1, no entry
            (OPTION_LIST, vec![1]),                                // payload where none belongs
            (OPTION_INFO, [string_field("a"), vec![0, 0, 7]].concat()), // trailing byte
            (OPTION_SET_META_CONTEXT, [string_field("a"), 0xFFFF_FFFFu32.to_be_bytes().to_vec()].concat()),
            (OPTION_GO, [(5000u32).to_be_bytes().to_vec(), vec![b'a'; 5000], vec![0, 0]].concat()),
            (OPTION_EXPORT_NAME, vec![0xFF, 0xFE]),
        ];
        for (option, payload) in cases {
            assert!(
                matches!(parse_option(*option, payload), Err(ProtocolError::MalformedOption { .. })),
                "{option}: {payload:?}"
            );
        }
    }

    #[test]
    fn headers_check_their_magic() {
        let mut header = [0u8; OPTION_HEADER_BYTES];
        header[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        header[8..12].copy_from_slice(&OPTION_GO.to_be_bytes());
        header[12..16].copy_from_slice(&7u32.to_be_bytes());
        assert_eq!(parse_option_header(&header), Ok(OptionHeader { option: OPTION_GO, length: 7 }));
        header[0] ^= 1;
        assert!(matches!(parse_option_header(&header), Err(ProtocolError::BadMagic(_))));
        assert!(parse_client_flags([0, 0, 0, 0]).is_err());
        assert!(parse_client_flags([0, 0, 0, 4 | 1]).is_err());
        assert_eq!(parse_client_flags([0, 0, 0, 3]), Ok(ClientFlags { no_zeroes: true }));
    }

    proptest! {
        #[test]
        fn requests_round_trip(flags in any::<u16>(), command in any::<u16>(), cookie in any::<u64>(),
                               offset_bytes in any::<u64>(), length_bytes in any::<u32>()) {
            let request = Request { flags, command, cookie, offset_bytes, length_bytes };
            prop_assert_eq!(parse_request(&encode_request(&request)), Ok(request));
        }

        /// Any bytes at all: parsing answers, never panics.
        #[test]
        fn arbitrary_option_payloads_never_panic(option in 0u32..12, payload in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_option(option, &payload);
        }
    }
}
