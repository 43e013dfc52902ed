//! Request bodies of `/v1/chat/completions` and `/v1/completions` as anyone may send them,
//! through everything the server does before looking up the cloud prompt.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let m = edgeprompt_fuzz::smollm2();
    let _ = edgeprompt_edge::http::check_request(m, "smollm2", pick & 1 == 0, body);
});
