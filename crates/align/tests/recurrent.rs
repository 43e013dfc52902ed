//! CE-LSLM maps attention KV: a hybrid model (Qwen3.5's Gated DeltaNet layers) is refused with
//! an error that says why, before any calibration runs.

use std::path::PathBuf;

use edgeprompt_align::{attention_only, collect, AlignError, Sampling};
use edgeprompt_engine::Model;

#[test]
fn a_model_with_recurrent_layers_is_refused_by_name() {
    let dir = std::env::var_os("EDGEPROMPT_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    let path = dir.join("synth/qwen35.gguf");
    assert!(
        path.exists(),
        "{}: run scripts/ref/synth.py",
        path.display()
    );
    let m = Model::load(&path).unwrap();
    let e = attention_only(&m).unwrap_err();
    assert!(matches!(e, AlignError::Recurrent(_)));
    assert!(e.to_string().contains("has recurrent layers"), "{e}");
    let ids = m.tokenizer.encode("a few calibration tokens").unwrap();
    let e = collect(
        &m,
        &[ids],
        Sampling {
            skip_first: 0,
            stride: 1,
        },
        |_, _| {},
    )
    .err()
    .unwrap();
    assert!(matches!(e, AlignError::Recurrent(_)), "{e}");
}
