//! Scoring a prompt (completions' `echo` with `logprobs`): every token's log-probability from
//! the row before it, against a single node fed one token at a time (bit for bit: a row's
//! arithmetic does not depend on the rows around it).

mod common;

use std::sync::Arc;

use edgeprompt_engine::{logprobs, Model, Sequence, TokenLogprobs};

const TOP: usize = 3;

fn ids(model: &Model) -> Vec<u32> {
    model
        .tokenizer
        .encode_prompt(
            "The quick brown fox jumps over the lazy dog. Refunds are possible up to 24 hours \
             before departure; after that, a fee of ten percent applies.",
        )
        .unwrap()
}

/// Token `j + 1`'s log-probabilities after tokens `..=j`, one token per forward pass.
fn one_at_a_time(model: &Model, ids: &[u32]) -> Vec<TokenLogprobs> {
    let mut seq = Sequence::new(model);
    ids.windows(2)
        .map(|w| logprobs(&seq.prefill(model, &w[..1]).unwrap(), w[1], TOP))
        .collect()
}

#[test]
fn scored_rows_equal_one_token_at_a_time_in_any_chunking() {
    let model = common::smollm2();
    let ids = ids(&model);
    assert!(ids.len() > 30);
    let want = one_at_a_time(&model, &ids);
    for chunk in [ids.len(), 7] {
        let mut seq = Sequence::new(&model);
        let mut got = Vec::new();
        for (k, c) in ids.chunks(chunk).enumerate() {
            let (last, rows) = model
                .forward_scoring(&mut [(&mut seq, c)], &[Some(TOP)])
                .unwrap()
                .remove(0);
            got.extend(rows);
            // The chunk's last row scores the next chunk's first token.
            if let Some(&next) = ids.get((k + 1) * chunk) {
                got.push(logprobs(&last, next, TOP));
            }
        }
        assert_eq!(got, want, "chunks of {chunk}");
    }
}

#[test]
fn scoring_changes_no_other_logits() {
    let model = common::smollm2();
    let ids = ids(&model);
    let (a_ids, b_ids) = ids.split_at(12);
    let (mut a, mut b) = (Sequence::new(&model), Sequence::new(&model));
    let plain = model
        .forward(&mut [(&mut a, a_ids), (&mut b, b_ids)])
        .unwrap();
    let (mut a, mut b) = (Sequence::new(&model), Sequence::new(&model));
    let scored = model
        .forward_scoring(&mut [(&mut a, a_ids), (&mut b, b_ids)], &[Some(2), None])
        .unwrap();
    assert_eq!(scored[0].0, plain[0]);
    assert_eq!(scored[1].0, plain[1]);
    assert_eq!(scored[0].1.len(), a_ids.len() - 1);
    assert!(scored[1].1.is_empty());
}

#[test]
fn prefix_logits_are_the_cloud_prompts_last_row() {
    let model = common::smollm2();
    let ids = ids(&model);
    let mut cloud = Sequence::new(&model);
    let want = cloud.prefill_chunked(&model, &ids, 16).unwrap();
    let prefix = cloud.export_prefix(&model).unwrap();
    assert_eq!(model.prefix_logits(&prefix).unwrap(), Some(want));
    // A one-token prompt has nothing before its token but runs all the same.
    let mut one = Sequence::new(&model);
    let want = one.prefill(&model, &ids[..1]).unwrap();
    let prefix = Arc::new(one.export_prefix(&model).unwrap());
    assert_eq!(model.prefix_logits(&prefix).unwrap(), Some(want));
}
