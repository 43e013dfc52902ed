//! A stream header from anyone, checked against the edge's model: errors are fine, a panic or
//! an allocation beyond the bounds is not.
#![no_main]

use edgeprompt_protocol::{Header, PromptRef};
use libfuzzer_sys::fuzz_target;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let Ok(h) = Header::decode(rest) else {
        return;
    };
    let m = edgeprompt_fuzz::smollm2();
    let asked = match pick & 1 {
        0 => PromptRef::Id(h.prompt_id.clone()),
        _ => PromptRef::ContentAddress(h.content_address.clone()),
    };
    let first = (pick >> 1) as usize % m.cfg.n_layer;
    let _ = edgeprompt_edge::client::check_header(m, &asked, first, h);
});
