//! Arbitrary conversations through the models' chat templates: whole, and split at the system
//! turn the way the edge splits a cloud prompt from the private part.
#![no_main]

use edgeprompt_engine::Message;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // Fields separated by NUL: role, content, role, content, ...
    let fields: Vec<&str> = text.split('\0').collect();
    let messages: Vec<Message> = fields
        .chunks(2)
        .map(|p| Message::new(p[0], p.get(1).copied().unwrap_or("")))
        .collect();
    for m in [edgeprompt_fuzz::smollm2(), edgeprompt_fuzz::qwen()] {
        let Some(chat) = &m.chat else { continue };
        let _ = chat.render(&messages, true);
        let _ = chat.render(&messages, false);
        if let Some((first, rest)) = messages.split_first() {
            let _ = chat.split(&first.content, rest);
        }
    }
});
