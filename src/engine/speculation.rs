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
//! kept in its place and ends the run. Every kept token is thus the one
//! decoding without drafts samples, from the same random key, whatever
//! was drafted: greedy and seeded output are identical, and sampled output
//! keeps the model's distribution. For a draft fixed in advance, as a
//! lookup's is, this is the standard rejection rule (accept with
//! probability p(d), else draw from p without d); a draft model draws its
//! proposals with the keys the rows will be sampled with
//! ([`crate::engine::drafter`]), so they hold wherever the two models'
//! distributions agree.
//!
//! Rejected drafts cost their rows and nothing else: their K/V, written
//! past the sequence's cache cursor, is overwritten by the next step.
//!
//! Here are the policies: [`lookup`] finds a draft; [`Acceptance`] keeps
//! how likely a sequence's drafted tokens have been to hold; and [`plan`]
//! decides how many of each row's drafted tokens the step runs, from those
//! odds and what a token costs against a whole step, so that drafts run
//! only where they are expected to raise the step's tokens per second. A
//! small batch is bound by reading the weights, and extra rows are cheap
//! beside the step; a big one is bound by arithmetic, every row costs
//! about as much as it yields, and drafts stop.

/// How prompt lookup drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Speculation {
    /// Most tokens drafted for one sequence in one step.
    pub max_draft: usize,
    /// Longest and shortest run of last tokens looked up, longest first.
    pub ngram_max: usize,
    pub ngram_min: usize,
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation {
            max_draft: 8,
            ngram_max: 4,
            ngram_min: 2,
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
}

/// The tokens that followed the latest earlier occurrence of `tokens`'
/// last `n` tokens, for the longest `n` in `ngram_min..=ngram_max` that
/// has one; at most `max` of them. Empty when nothing matches.
pub fn lookup(tokens: &[u32], ngram_min: usize, ngram_max: usize, max: usize) -> &[u32] {
    // Latest first: recent text predicts best.
    matched(tokens, tokens, tokens.len(), ngram_min, ngram_max, max)
}

/// What a request's `prediction` says comes next after `output` (the
/// tokens sampled so far; `tokens` is the prompt and them): the rest of
/// the prediction while the output is a prefix of it, else what follows
/// the occurrence of the last few tokens nearest where the output has got
/// to, as in [`lookup`]. At most `max` tokens.
pub fn predicted<'a>(
    prediction: &'a [u32],
    output: &[u32],
    tokens: &[u32],
    ngram_min: usize,
    ngram_max: usize,
    max: usize,
) -> &'a [u32] {
    if let Some(rest) = prediction.strip_prefix(output) {
        return &rest[..max.min(rest.len())];
    }
    matched(prediction, tokens, output.len(), ngram_min, ngram_max, max)
}

/// At most `max` tokens of `text` after an occurrence of `tokens`' last
/// `n` tokens (the longest `n` in `ngram_min..=ngram_max` that has one),
/// the occurrence ending nearest `near`, later on a tie; something must
/// follow it.
fn matched<'a>(
    text: &'a [u32],
    tokens: &[u32],
    near: usize,
    ngram_min: usize,
    ngram_max: usize,
    max: usize,
) -> &'a [u32] {
    if max == 0 {
        return &[];
    }
    for n in (ngram_min..=ngram_max).rev() {
        if n > tokens.len() || n >= text.len() {
            continue;
        }
        let tail = &tokens[tokens.len() - n..];
        let found = (0..text.len() - n)
            .filter(|&start| &text[start..start + n] == tail)
            .min_by_key(|&start| ((start + n).abs_diff(near), usize::MAX - start));
        if let Some(start) = found {
            let from = start + n;
            return &text[from..(from + max).min(text.len())];
        }
    }
    &[]
}

/// A drafted token the draft model is yet to propose: the scheduler
/// plans how many a row drafts, and [`crate::engine::drafter::Drafter`]
/// fills them in before the forward. Never a vocabulary id.
pub const MODEL_DRAFT: u32 = u32::MAX;

/// A step's fixed cost over one token's, assumed until the steps timed
/// vary enough in size to measure it: a pass over the weights costs about
/// as much as four extra rows, as for a small model on two cores.
pub const PRIOR_FIXED_COST_IN_TOKENS: f64 = 4.0;

/// A draft model's round in token-costs, assumed until one is timed: a
/// model a few times smaller than the one it drafts for.
pub const PRIOR_ROUND_COST_IN_TOKENS: f64 = 1.0;

/// How likely a sequence's next drafted token is to hold, given the ones
/// before it did: kept tokens over kept tokens and misses, recent drafts
/// weighing most. It starts hopeful, so a sequence's first drafts run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acceptance {
    kept: f64,
    missed: f64,
}

/// How much of the past each new draft leaves.
const ACCEPTANCE_DECAY: f64 = 0.7;

impl Default for Acceptance {
    fn default() -> Self {
        Acceptance {
            kept: 3.0,
            missed: 1.0,
        }
    }
}

impl Acceptance {
    pub fn p(&self) -> f64 {
        self.kept / (self.kept + self.missed)
    }

    /// After a draft of `drafted` tokens of which the first `accepted` held.
    pub fn update(&mut self, drafted: usize, accepted: usize) {
        self.kept = self.kept * ACCEPTANCE_DECAY + accepted as f64;
        self.missed = self.missed * ACCEPTANCE_DECAY + f64::from(accepted < drafted);
    }
}

/// What a decode row could draft, as the plan weighs it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Offered {
    /// Its [`Acceptance::p`].
    pub p: f64,
    /// How many tokens its prediction or lookup offers, or placeholders
    /// for the draft model; none for a row that cannot draft.
    pub tokens: usize,
    /// Whether the draft model is to propose them.
    pub by_model: bool,
}

/// How many drafted tokens each of a step's decode rows runs. A step costs
/// `fixed + tokens` token-costs; a row's j-th drafted token is expected to
/// yield `p^j` tokens. A draft model proposes one token a round, all rows
/// at once, and a round costs `round` token-costs: a row's j-th proposal
/// pays for a round unless another row's already needs j of them. Tokens
/// are taken best first while each raises the step's expected tokens per
/// cost, and at most `room` in all.
pub fn plan(rows: &[Offered], fixed: f64, round: f64, room: usize) -> Vec<usize> {
    let mut take = vec![0; rows.len()];
    let mut gains: Vec<(f64, usize)> = rows
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            (1..=r.tokens).scan(1.0, move |g, _| {
                *g *= r.p;
                Some((*g, i))
            })
        })
        .collect();
    // Best first; a row's gains fall with j, so its tokens come in order,
    // and a row stops at the first it does not take.
    gains.sort_by(|a, b| b.0.total_cmp(&a.0));
    let (mut yield_, mut cost) = (rows.len() as f64, fixed + rows.len() as f64);
    let (mut rounds, mut room) = (0, room);
    let mut stopped = vec![false; rows.len()];
    for (gain, i) in gains {
        if room == 0 {
            break;
        }
        if stopped[i] {
            continue;
        }
        let j = take[i] + 1;
        let by_model = rows[i].by_model;
        let price = 1.0 + if by_model && j > rounds { round } else { 0.0 };
        // Worth it iff (yield + gain) / (cost + price) > yield / cost.
        if gain * cost <= yield_ * price {
            stopped[i] = true;
            continue;
        }
        yield_ += gain;
        cost += price;
        take[i] = j;
        room -= 1;
        if by_model {
            rounds = rounds.max(j);
        }
    }
    take
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

/// What one round of the draft model's proposals
/// ([`crate::engine::drafter::Drafter::propose`]) ran.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DraftRun {
    /// Proposal rounds: forwards of one token a drafting row.
    pub rounds: usize,
    /// Whether prompt chunks were cached too.
    pub prefilled: bool,
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
    fn a_prediction_drafts_its_rest_then_realigns_after_an_edit() {
        // prompt 9 9; prediction "1 2 3 4 5 6".
        let pred = [1, 2, 3, 4, 5, 6];
        let at = |output: &[u32], max| {
            let tokens: Vec<u32> = [9, 9].iter().chain(output).copied().collect();
            predicted(&pred, output, &tokens, 1, 2, max).to_vec()
        };
        assert_eq!(at(&[], 3), [1, 2, 3], "from the start");
        assert_eq!(at(&[1, 2], 8), [3, 4, 5, 6]);
        assert!(at(&[1, 2, 3, 4, 5, 6], 8).is_empty(), "all used");
        // An edit: "1 2 7 3" goes on from the prediction's "3".
        assert_eq!(at(&[1, 2, 7, 3], 8), [4, 5, 6]);
        assert!(at(&[8, 8, 8], 8).is_empty(), "nothing matches");
        // Of two occurrences, the one nearest the output's progress.
        let pred = [5, 1, 2, 5, 3, 4, 5, 6];
        let tokens = [0, 9, 9, 9, 9, 9, 5];
        assert_eq!(predicted(&pred, &tokens[1..], &tokens, 1, 1, 1), [6]);
        assert_eq!(predicted(&pred, &tokens[4..], &tokens, 1, 1, 1), [3]);
    }

    #[test]
    fn a_repeating_pattern_drafts_through_its_own_tail() {
        // The occurrence may overlap the tail: "x x x" predicts more x.
        assert_eq!(lookup(&[9, 9, 9], 2, 2, 4), &[9]);
        assert_eq!(lookup(&[1, 2, 1, 2, 1, 2], 2, 2, 8), &[1, 2]);
    }

    #[test]
    fn acceptance_follows_recent_drafts() {
        let mut a = Acceptance::default();
        assert!(a.p() > 0.5, "hopeful at first");
        for _ in 0..10 {
            a.update(4, 0);
        }
        assert!(a.p() < 0.05, "{}", a.p());
        for _ in 0..10 {
            a.update(4, 4);
        }
        assert!(a.p() > 0.9, "{}", a.p());
        // Four kept then a miss: four in five.
        let mut a = Acceptance {
            kept: 0.0,
            missed: 0.0,
        };
        a.update(6, 4);
        assert!((a.p() - 0.8).abs() < 1e-9);
    }

    /// Rows drafting by lookup, `(p, tokens offered)` each.
    fn by_lookup(rows: &[(f64, usize)]) -> Vec<Offered> {
        rows.iter()
            .map(|&(p, tokens)| Offered {
                p,
                tokens,
                by_model: false,
            })
            .collect()
    }

    #[test]
    fn a_lone_row_drafts_while_its_tokens_are_likely_to_hold() {
        let plan = |rows: &[(f64, usize)], room| plan(&by_lookup(rows), 4.0, 0.0, room);
        // fixed cost 4: one row alone yields 1 per 5; a token is worth
        // running while p^j beats the step's tokens per cost.
        assert_eq!(plan(&[(0.97, 8)], 512), vec![8]);
        assert_eq!(plan(&[(0.9, 8)], 512), vec![7], "the eighth yields 0.43");
        let some = plan(&[(0.6, 8)], 512)[0];
        assert!((1..8).contains(&some), "{some}");
        assert_eq!(plan(&[(0.15, 8)], 512), vec![0], "below 1/5");
        assert_eq!(plan(&[(0.9, 3)], 512), vec![3], "what lookup offers");
        assert_eq!(plan(&[(0.9, 8)], 5), vec![5], "within the room");
    }

    #[test]
    fn big_batches_back_off_and_likely_rows_go_first() {
        // 64 rows of a 4-token-fixed-cost model: each row already yields
        // about one per cost, and no draft beats that.
        let rows = by_lookup(&vec![(0.8, 8); 64]);
        assert!(plan(&rows, 4.0, 0.0, 512).iter().all(|&k| k == 0));
        // Few rows: the likely one drafts more than the doubtful one.
        let k = plan(&by_lookup(&[(0.9, 8), (0.4, 8), (0.9, 0)]), 4.0, 0.0, 512);
        assert!(k[0] > k[1] && k[2] == 0, "{k:?}");
        // A dearer fixed cost (a GPU, a big model) makes drafts cheaper.
        let doubtful = by_lookup(&[(0.4, 8)]);
        assert!(plan(&doubtful, 50.0, 0.0, 512)[0] > plan(&doubtful, 4.0, 0.0, 512)[0]);
    }

    #[test]
    fn a_draft_model_drafts_only_where_its_rounds_pay() {
        let by_model = |p, tokens| Offered {
            p,
            tokens,
            by_model: true,
        };
        // A model as dear as the target (it drafts for itself): a round
        // costs a whole step, and nothing is worth it even if all holds.
        assert_eq!(plan(&[by_model(1.0, 8)], 4.0, 5.0, 512), vec![0]);
        // A tenth of its size: it drafts deep, though less deep than a
        // lookup that holds as well and costs no rounds.
        let small = plan(&[by_model(0.9, 8)], 4.0, 0.5, 512)[0];
        let free = plan(&by_lookup(&[(0.9, 8)]), 4.0, 0.0, 512)[0];
        assert!((3..free).contains(&small), "{small} against {free}");
        // Rounds are shared: a doubtful row rides the rounds a sure one
        // runs anyway, where paying for its own would not be worth it.
        let sure = |by_model| Offered {
            p: 1.0,
            tokens: 8,
            by_model,
        };
        let riding = plan(&[sure(true), by_model(0.5, 8)], 4.0, 1.0, 512);
        let paying = plan(&[sure(false), by_model(0.5, 8)], 4.0, 1.0, 512);
        assert!(riding[1] > 0 && paying[1] == 0, "{riding:?} {paying:?}");
        // A lookup row beside a model row that does not pay drafts as alone.
        let mixed = plan(
            &[by_model(0.9, 8), by_lookup(&[(0.9, 8)])[0]],
            4.0,
            50.0,
            512,
        );
        assert_eq!(mixed[0], 0);
        assert!(mixed[1] > 0, "{mixed:?}");
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
