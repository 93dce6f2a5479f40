//! Every parser of the NBD codec on arbitrary bytes: it must answer (Ok or Err), never
//! panic, and a request that parses must encode back to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stripelog_nbd::codec;

fuzz_target!(|data: &[u8]| {
    if let Some((&selector, rest)) = data.split_first() {
        let _ = codec::parse_option(u32::from(selector % 12), rest);
    }
    if let Ok(flags) = <[u8; 4]>::try_from(&data[..data.len().min(4)]) {
        let _ = codec::parse_client_flags(flags);
    }
    if let Ok(header) = <&[u8; codec::OPTION_HEADER_BYTES]>::try_from(&data[..data.len().min(codec::OPTION_HEADER_BYTES)]) {
        let _ = codec::parse_option_header(header);
    }
    if let Ok(header) = <&[u8; codec::REQUEST_HEADER_BYTES]>::try_from(&data[..data.len().min(codec::REQUEST_HEADER_BYTES)]) {
        if let Ok(request) = codec::parse_request(header) {
            assert_eq!(&codec::encode_request(&request), header);
        }
    }
});
