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
        // Pinned (computed independently with Python's hashlib over the same bytes): a change
        // here breaks every cache in the field.
        let pinned = [
            (
                "abc",
                &[1, 2, 3][..],
                "c8ee8027f1440cb55fdd5cc7adc6aaa4c09f5d412ccd80681fcc70e68cfd5ad2",
            ),
            (
                "abd",
                &[1, 2, 3],
                "bac8b161ccda3f186c40c9f5184cb37eb56ad453b920220bdaba917524225a1d",
            ),
            (
                "abc",
                &[1, 2, 4],
                "504a829d78877fec45d6fad699e6ac4fe248bd2926f2691bc6ccbfd9cfdfc254",
            ),
            (
                "abc",
                &[1, 2],
                "49e4c63e536a3859e962217da743793d13d070c258617ffdb9bd7cb60dce06af",
            ),
            (
                "",
                &[],
                "4bbe72efb44be16a84b05a92146fa49bc48995525da8a748b7679d3b2b8d81a0",
            ),
        ];
        for (fingerprint, ids, hex) in pinned {
            assert_eq!(
                content_address(fingerprint, ids),
                hex,
                "{fingerprint:?} {ids:?}"
            );
        }
    }
}
