//! A step's plan, apart from the model: what each running request feeds, from what each can
//! take and the step's prefill budget. The batcher applies it (`Batcher::step`).

/// What a running request can take this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Want {
    /// Nothing: its cloud prompt's layers are still on their way.
    Layers,
    /// This many prompt tokens are still to prefill.
    Prompt(usize),
    /// Its next token (none when it has nothing to feed).
    Token(bool),
}

/// What each request feeds this step: prompts share `budget` tokens in batch order (chunked
/// prefill: a long prompt holds the decoding rows back by one chunk at most), decoding
/// requests one token each.
pub(super) fn plan(wants: &[Want], mut budget: usize) -> Vec<Option<Feed>> {
    wants
        .iter()
        .map(|w| match *w {
            Want::Layers | Want::Token(false) => None,
            Want::Prompt(left) => {
                let n = budget.min(left);
                budget -= n;
                (n > 0).then_some(Feed::Prompt(n))
            }
            Want::Token(true) => Some(Feed::Token),
        })
        .collect()
}

/// One request's share of a step: this many of its prompt's next tokens, or its next token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Feed {
    Prompt(usize),
    Token,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_share_the_budget_in_order_and_decoding_rows_take_one_token() {
        let wants = [
            Want::Token(true),
            Want::Prompt(300),
            Want::Layers,
            Want::Prompt(50),
            Want::Token(false),
            Want::Token(true),
        ];
        assert_eq!(
            plan(&wants, 256),
            [
                Some(Feed::Token),
                Some(Feed::Prompt(256)),
                None,
                None,
                None,
                Some(Feed::Token),
            ]
        );
        assert_eq!(
            plan(&[Want::Prompt(10), Want::Prompt(10)], 15),
            [Some(Feed::Prompt(10)), Some(Feed::Prompt(5))]
        );
    }
}
