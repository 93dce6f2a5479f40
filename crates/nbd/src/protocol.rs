//! NBD protocol constants (NetworkBlockDevice/nbd `doc/proto.md`).

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const CLIENT_FLAG_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_FLAG_NO_ZEROES: u32 = 1 << 1;

// Options.
pub const OPTION_EXPORT_NAME: u32 = 1;
pub const OPTION_ABORT: u32 = 2;
pub const OPTION_LIST: u32 = 3;
pub const OPTION_STARTTLS: u32 = 5;
pub const OPTION_INFO: u32 = 6;
pub const OPTION_GO: u32 = 7;
pub const OPTION_STRUCTURED_REPLY: u32 = 8;
pub const OPTION_LIST_META_CONTEXT: u32 = 9;
pub const OPTION_SET_META_CONTEXT: u32 = 10;

// Option replies.
pub const REPLY_ACK: u32 = 1;
pub const REPLY_SERVER: u32 = 2;
pub const REPLY_INFO: u32 = 3;
pub const REPLY_META_CONTEXT: u32 = 4;
pub const REPLY_ERROR_UNSUPPORTED: u32 = (1 << 31) + 1;
pub const REPLY_ERROR_POLICY: u32 = (1 << 31) + 2;
pub const REPLY_ERROR_INVALID: u32 = (1 << 31) + 3;
pub const REPLY_ERROR_TLS_REQUIRED: u32 = (1 << 31) + 5;
pub const REPLY_ERROR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REPLY_ERROR_TOO_BIG: u32 = (1 << 31) + 9;

// Information types of NBD_REP_INFO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const TRANSMISSION_HAS_FLAGS: u16 = 1 << 0;
pub const TRANSMISSION_READ_ONLY: u16 = 1 << 1;
pub const TRANSMISSION_SEND_FLUSH: u16 = 1 << 2;
pub const TRANSMISSION_SEND_FUA: u16 = 1 << 3;
pub const TRANSMISSION_SEND_TRIM: u16 = 1 << 5;
pub const TRANSMISSION_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TRANSMISSION_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TRANSMISSION_SEND_CACHE: u16 = 1 << 10;
pub const TRANSMISSION_SEND_FAST_ZERO: u16 = 1 << 11;

// Commands and their flags.
pub const COMMAND_READ: u16 = 0;
pub const COMMAND_WRITE: u16 = 1;
pub const COMMAND_DISCONNECT: u16 = 2;
pub const COMMAND_FLUSH: u16 = 3;
pub const COMMAND_TRIM: u16 = 4;
pub const COMMAND_CACHE: u16 = 5;
pub const COMMAND_WRITE_ZEROES: u16 = 6;
pub const COMMAND_BLOCK_STATUS: u16 = 7;
pub const COMMAND_FLAG_FUA: u16 = 1 << 0;
pub const COMMAND_FLAG_NO_HOLE: u16 = 1 << 1;
pub const COMMAND_FLAG_DONT_FRAGMENT: u16 = 1 << 2;
pub const COMMAND_FLAG_REQUEST_ONE: u16 = 1 << 3;
pub const COMMAND_FLAG_FAST_ZERO: u16 = 1 << 4;

// Structured reply chunks.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const CHUNK_NONE: u16 = 0;
pub const CHUNK_OFFSET_DATA: u16 = 1;
pub const CHUNK_BLOCK_STATUS: u16 = 5;
pub const CHUNK_ERROR: u16 = (1 << 15) + 1;

// base:allocation.
pub const META_CONTEXT_BASE_ALLOCATION: &str = "base:allocation";
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

// Error numbers on the wire.
pub const ERROR_PERMISSION: u32 = 1;
pub const ERROR_IO: u32 = 5;
pub const ERROR_NO_MEMORY: u32 = 12;
pub const ERROR_INVALID: u32 = 22;
pub const ERROR_NO_SPACE: u32 = 28;
pub const ERROR_OVERFLOW: u32 = 75;
pub const ERROR_NOT_SUPPORTED: u32 = 95;
pub const ERROR_SHUTDOWN: u32 = 108;
