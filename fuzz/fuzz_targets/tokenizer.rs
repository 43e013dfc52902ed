//! Arbitrary text through each tokenizer, and arbitrary ids back to text.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let ids: Vec<u32> = data
        .chunks(2)
        .map(|c| u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0)))
        .collect();
    for m in [
        edgeprompt_fuzz::smollm2(),
        edgeprompt_fuzz::qwen(),
        edgeprompt_fuzz::gemma(),
    ] {
        let t = &m.tokenizer;
        if let Ok(enc) = t.encode(&text) {
            let _ = t.decode(&enc);
        }
        let _ = t.encode_prompt(&text);
        // Ids past the vocabulary too (2^16 > every vocabulary here but Gemma's 262 144).
        let _ = t.decode(&ids);
    }
});
