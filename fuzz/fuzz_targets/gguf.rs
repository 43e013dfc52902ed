//! A model file's header from anyone: errors are fine; a panic, or an allocation the file's
//! length does not bound, is not.
#![no_main]

use edgeprompt_engine::gguf::Content;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut r = std::io::Cursor::new(data);
    if let Ok(c) = Content::read(&mut r, data.len() as u64) {
        for t in c.tensor_infos.values() {
            let _ = t.elements().and_then(|n| t.dtype.bytes(n));
        }
    }
});
