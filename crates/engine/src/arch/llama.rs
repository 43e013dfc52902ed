//! Llama 2 and 3.x (`llama`): the plain transformer. Llama 3.1/3.2's long-context RoPE comes
//! as a `rope_freqs` tensor of per-frequency divisors (read with the weights), and 3.2's small
//! models tie the output to the embedding (no `output.weight`).

use super::Features;

pub fn features(plain: Features) -> Features {
    plain
}
