//! Every decoder of untrusted bytes (protobuf frames, chunks, reassembler, codecs, stored
//! prefixes): must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    edgeprompt_protocol::untrusted::read_untrusted(data);
});
