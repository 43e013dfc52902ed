//! The multi-process SeaweedFS keeps two copies: an object outlives a volume server.

use edgeprompt_testbed::{raw, weed_cluster};
use object_store::{ObjectStoreExt, PutPayload};

#[test]
fn an_object_outlives_the_volume_server_that_held_it() {
    let mut w = weed_cluster(3);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = raw(w.s3);
    let body: Vec<u8> = (0..12_000_000u32)
        .map(|i| (i.wrapping_mul(7919) >> 3) as u8)
        .collect();
    rt.block_on(store.put(&"a/b.kv".into(), PutPayload::from(body.clone())))
        .unwrap();
    // Each volume server in turn is the one gone (the object is on two of the three).
    w.kill_volume(0);
    let got = rt
        .block_on(async { store.get(&"a/b.kv".into()).await?.bytes().await })
        .unwrap();
    assert_eq!(got.as_ref(), &body[..]);
    assert_eq!(w.live_volumes(), 2, "the master saw it go");
}
