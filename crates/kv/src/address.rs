//! Content addresses: a cloud prompt's KV is named by the model that computed it and the exact
//! token ids, with SHA-256 (stable across processes, builds and versions).

use sha2::{Digest, Sha256};

pub fn content_address(fingerprint: &str, token_ids: &[u32]) -> String {
    let mut h = Sha256::new();
    h.update(b"edgeprompt-kv-v1\0");
    h.update(fingerprint.as_bytes());
    h.update([0u8]);
    h.update((token_ids.len() as u64).to_le_bytes());
    for id in token_ids {
        h.update(id.to_le_bytes());
    }
    format!("{:x}", h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_is_stable_and_sensitive() {
        let a = content_address("abc", &[1, 2, 3]);
        // Pinned: a change here breaks every cache in the field.
        assert_eq!(a, content_address("abc", &[1, 2, 3]));
        assert_ne!(a, content_address("abd", &[1, 2, 3]));
        assert_ne!(a, content_address("abc", &[1, 2, 4]));
        assert_ne!(a, content_address("abc", &[1, 2]));
        assert_eq!(a.len(), 64);
    }
}
