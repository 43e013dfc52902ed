//! The product's own commands end to end, as a user runs them: `edgeprompt cloud` makes and
//! keeps a signing key, the one-shot `edgeprompt edge` pins it on first contact and answers as
//! a single node (`edgeprompt generate`) does, computes a private system message here, refuses
//! a cloud whose key changed (and still answers, from its own compute), and `edgeprompt demo`
//! gives the edge-only answer.

use std::path::Path;

const PUBLIC: &str = "You are the support assistant of Acme Rail. Refunds: full up to 24 hours before departure, then a 20% fee.";
const PRIVATE: &str = "You assist Dana Whitfield, account 4417. Be brief.";
const USER: &str = "Can I get my money back two hours before departure?";

mod common;
use common::{bin, cloud, run};

fn edge(url: &str, known: &Path, system: &str) -> (String, String) {
    run(bin()
        .args([
            "edge",
            "--model",
            "smollm2",
            "--cloud",
            url,
            "--max-tokens",
            "24",
        ])
        .args(["--system", system, "--prompt", USER, "--known-clouds"])
        .arg(known))
}

fn single_node(system: &str) -> String {
    run(bin()
        .args(["generate", "--model", "smollm2", "--max-tokens", "24"])
        .args(["--system", system, "--prompt", USER]))
    .0
}

#[test]
fn the_one_shot_edge_pins_the_clouds_key_and_answers_as_a_single_node() {
    let dir = tempfile::tempdir().unwrap();
    let known = dir.path().join("known_clouds");
    let (c, url) = cloud(dir.path(), PUBLIC);
    let key = std::fs::read_to_string(dir.path().join("cloud.pub")).unwrap();
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(dir.path().join("cloud.key"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the secret key is its owner's only");

    let (out, err) = edge(&url, &known, PUBLIC);
    assert!(err.contains("KV from cloud"), "{err}");
    assert_eq!(
        out,
        single_node(PUBLIC),
        "split over the network = single node"
    );
    let pinned = std::fs::read_to_string(&known).unwrap();
    assert!(
        pinned.contains(key.trim()),
        "pinned on first contact: {pinned}"
    );

    let (out, err) = edge(&url, &known, PRIVATE);
    assert!(err.contains("KV from local: 0 bytes up, 0 down"), "{err}");
    assert_eq!(out, single_node(PRIVATE));

    // The cloud comes back with another key: refused, named, and answered here all the same.
    drop(c);
    std::fs::remove_file(dir.path().join("cloud.key")).unwrap();
    let (_c, url2) = cloud(dir.path(), PUBLIC);
    let moved = url2.rsplit(':').next().unwrap();
    let pinned = pinned.replace(url.rsplit(':').next().unwrap(), moved);
    std::fs::write(&known, pinned).unwrap();
    let (out, err) = edge(&url2, &known, PUBLIC);
    assert!(err.contains("now shows signing key"), "{err}");
    assert!(err.contains("KV from local"), "{err}");
    assert_eq!(out, single_node(PUBLIC));
}

#[test]
fn the_demo_gives_the_edge_only_answer() {
    let (out, _) = run(bin().args(["demo", "--model", "smollm2", "--max-tokens", "24"]));
    assert!(out.contains("KV from the cloud"), "{out}");
    assert!(
        out.contains("checked against the cloud's Ed25519 key"),
        "{out}"
    );
    assert!(out.contains("same answer as edge-only: yes"), "{out}");
}
