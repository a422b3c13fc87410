//! Speculative decoding by prompt lookup: a decode row that finds its last
//! few tokens earlier in its own text (the prompt, or what it wrote) guesses
//! that what followed them then follows now, and runs those guessed tokens
//! through the same forward as its real one. One weight pass then scores
//! several positions: where the guesses hold, the step yields more than one
//! token.
//!
//! What is kept stays exactly what decoding one token at a time would
//! give. Each row is sampled as usual, by the sequence's own sampler and
//! RNG, seeing the tokens accepted before it; a drafted token is accepted
//! only if it is the token sampled, and the first token that differs is
//! kept in its place and ends the run. For a draft that proposes one token
//! with certainty this is the standard rejection rule (accept with
//! probability p(d), else draw from p without d), so sampled output keeps
//! the model's distribution and greedy output is identical; a seeded
//! request draws the same numbers in the same order.
//!
//! Rejected drafts cost their rows and nothing else: their K/V, written
//! past the sequence's cache cursor, is overwritten by the next step.
//!
//! Here are the policies: [`lookup`] finds a draft, [`DraftLength`] sets how
//! long a sequence's drafts may be from how many it had accepted, and
//! [`Speculation`] keeps drafts to steps with few decode rows, where a
//! forward pass is bound by reading the weights rather than by arithmetic.

/// How prompt lookup drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speculation {
    /// Most tokens drafted for one sequence in one step.
    pub max_draft: usize,
    /// Longest and shortest run of last tokens looked up, longest first.
    pub ngram_max: usize,
    pub ngram_min: usize,
    /// No drafts in a step with more decode rows than this: a big batch is
    /// compute-bound already, and drafted rows would slow every stream.
    pub max_batch: usize,
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation {
            max_draft: 8,
            ngram_max: 4,
            ngram_min: 2,
            max_batch: 8,
        }
    }
}

impl Speculation {
    /// Options that cannot work, named.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_draft == 0 {
            return Err("--num-speculative-tokens must be at least 1".into());
        }
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max {
            return Err(format!(
                "--prompt-lookup-min ({}) must be at least 1 and at most --prompt-lookup-max ({})",
                self.ngram_min, self.ngram_max
            ));
        }
        Ok(())
    }

    /// Whether a step with `decode_rows` decode rows drafts at all.
    pub fn drafts_with(&self, decode_rows: usize) -> bool {
        decode_rows <= self.max_batch
    }
}

/// The tokens that followed the latest earlier occurrence of `tokens`'
/// last `n` tokens, for the longest `n` in `ngram_min..=ngram_max` that
/// has one; at most `max` of them. Empty when nothing matches.
pub fn lookup(tokens: &[u32], ngram_min: usize, ngram_max: usize, max: usize) -> &[u32] {
    if max == 0 {
        return &[];
    }
    for n in (ngram_min..=ngram_max).rev() {
        if n >= tokens.len() {
            continue;
        }
        let tail = &tokens[tokens.len() - n..];
        // Latest first: recent text predicts best. The occurrence must end
        // before the tail does, and something must follow it.
        let found = (0..tokens.len() - n)
            .rev()
            .find(|&start| &tokens[start..start + n] == tail);
        if let Some(start) = found {
            let from = start + n;
            return &tokens[from..(from + max).min(tokens.len())];
        }
    }
    &[]
}

/// How many tokens a sequence may draft next: more while its drafts are
/// accepted whole, fewer when they are not (the heuristic of transformers'
/// assisted generation), so text the lookup cannot predict costs few rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DraftLength {
    len: usize,
}

impl DraftLength {
    /// Starts at `max`: the first draft decides.
    pub fn new(max: usize) -> Self {
        DraftLength { len: max }
    }

    pub fn get(&self) -> usize {
        self.len
    }

    /// After a draft of `drafted` tokens of which the first `accepted` held.
    pub fn update(&mut self, drafted: usize, accepted: usize, max: usize) {
        self.len = if accepted == drafted {
            (self.len + 2).min(max)
        } else {
            self.len.saturating_sub(1).max(1)
        };
    }
}

/// Drafted and accepted tokens: one verification, or a sum of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftTally {
    /// Verifications (steps in which a sequence ran a draft).
    pub drafts: u64,
    pub drafted: u64,
    pub accepted: u64,
}

impl DraftTally {
    pub fn one(drafted: usize, accepted: usize) -> Self {
        DraftTally {
            drafts: 1,
            drafted: drafted as u64,
            accepted: accepted as u64,
        }
    }

    pub fn add(&mut self, other: DraftTally) {
        self.drafts += other.drafts;
        self.drafted += other.drafted;
        self.accepted += other.accepted;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_continues_the_latest_earlier_occurrence() {
        // "a b c d a b" -> after the earlier "a b" came "c d".
        let t = [1, 2, 3, 4, 1, 2];
        assert_eq!(lookup(&t, 1, 2, 8), &[3, 4, 1, 2]);
        assert_eq!(lookup(&t, 1, 2, 2), &[3, 4]);
        // The latest of two occurrences wins.
        let t = [1, 2, 7, 1, 2, 9, 1, 2];
        assert_eq!(lookup(&t, 2, 2, 1), &[9]);
    }

    #[test]
    fn lookup_prefers_the_longest_match() {
        // The last 1-gram "2" last occurred before 8; the 2-gram "1 2"
        // only before 5.
        let t = [1, 2, 5, 6, 2, 8, 1, 2];
        assert_eq!(lookup(&t, 1, 2, 1), &[5]);
        assert_eq!(lookup(&t, 1, 1, 1), &[8]);
    }

    #[test]
    fn lookup_finds_nothing_below_the_minimum_or_without_a_match() {
        assert!(lookup(&[1, 2, 3, 4], 1, 3, 4).is_empty());
        // Only a 1-gram matches, and the minimum is 2.
        assert!(lookup(&[5, 1, 6, 1], 2, 3, 4).is_empty());
        assert_eq!(lookup(&[5, 1, 6, 1], 1, 3, 4), &[6, 1]);
        assert!(lookup(&[1, 1], 1, 3, 0).is_empty());
        assert!(lookup(&[], 1, 3, 4).is_empty());
        // A run longer than the text is skipped, not an out-of-range read.
        assert_eq!(lookup(&[3, 3], 1, 8, 4), &[3]);
    }

    #[test]
    fn a_repeating_pattern_drafts_through_its_own_tail() {
        // The occurrence may overlap the tail: "x x x" predicts more x.
        assert_eq!(lookup(&[9, 9, 9], 2, 2, 4), &[9]);
        assert_eq!(lookup(&[1, 2, 1, 2, 1, 2], 2, 2, 8), &[1, 2]);
    }

    #[test]
    fn draft_length_grows_on_full_acceptance_and_shrinks_otherwise() {
        let mut d = DraftLength::new(8);
        d.update(8, 3, 8);
        assert_eq!(d.get(), 7);
        d.update(7, 0, 8);
        assert_eq!(d.get(), 6);
        d.update(6, 6, 8);
        assert_eq!(d.get(), 8, "capped at the maximum");
        for _ in 0..20 {
            d.update(1, 0, 8);
        }
        assert_eq!(d.get(), 1, "never below one");
        d.update(1, 1, 8);
        assert_eq!(d.get(), 3);
    }

    #[test]
    fn big_batches_do_not_draft() {
        let s = Speculation {
            max_batch: 4,
            ..Speculation::default()
        };
        assert!(s.drafts_with(1) && s.drafts_with(4));
        assert!(!s.drafts_with(5));
    }

    #[test]
    fn impossible_options_are_named() {
        let bad = Speculation {
            ngram_min: 5,
            ngram_max: 3,
            ..Speculation::default()
        };
        assert!(bad.validate().unwrap_err().contains("--prompt-lookup-min"));
        let bad = Speculation {
            max_draft: 0,
            ..Speculation::default()
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .contains("--num-speculative-tokens"));
        assert!(Speculation::default().validate().is_ok());
    }
}
