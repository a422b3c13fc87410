//! Per-request token sampling.
//!
//! Each call to [`Sampler::sample`] runs, in vLLM's order:
//!
//! 1. logprobs: the chosen token's logprob and the top-n alternatives are read
//!    from the log-softmax of the *raw* logits, before any of the steps below,
//!    so they describe the model's distribution rather than the sampler's;
//! 2. `logit_bias` (added);
//! 3. `repetition_penalty` (HF/vLLM: over the distinct prompt and output
//!    tokens, positive logits are divided by it and negative ones multiplied);
//! 4. `presence_penalty` and `frequency_penalty` (OpenAI: over output tokens,
//!    `logit -= presence * (count > 0) + frequency * count`);
//! 5. `min_tokens`: while fewer tokens were generated, the stop token ids and
//!    the EOS ids (see [`Sampler::set_eos_ids`]) are masked;
//! 6. temperature 0 → argmax, otherwise temperature, top-k, top-p, min-p and
//!    one draw keyed by a number from the sampler's own seeded RNG (an
//!    exponential race over the survivors, [`crate::sampling::race`]).
//!
//! Steps 2–5 modify the caller's logits in place.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::sampling::argmax::argmax;
use crate::sampling::device::DeviceRow;
use crate::sampling::params::SamplingParams;
use crate::sampling::race::race;
pub use crate::sampling::token::SampledToken;
use crate::vec_math::{exp_into, fast_exp, max_of};

/// Temperatures below this are greedy, as in vLLM: dividing by a near-zero
/// temperature would only approximate argmax while still consuming randomness.
const GREEDY_TEMPERATURE: f32 = 1e-5;

/// How many of the most likely tokens nucleus sampling selects and sorts
/// first, growing 4x while their mass falls short. LLM distributions are
/// usually peaked, so the vocabulary is rarely sorted whole.
const NUCLEUS_CHUNK: usize = 64;

/// Samples the tokens of one request; owns that request's RNG so seeded
/// requests are reproducible whatever else the batch contains.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// Ids masked while fewer than `min_tokens` tokens were generated.
    min_tokens_mask: Vec<u32>,
    /// The logits as they came in, for the chosen token's logprob.
    raw: Vec<f32>,
    /// Surviving `(id, value)` pairs of the filters; reused across calls.
    cand: Vec<(u32, f32)>,
    /// Per-token exponentials; reused across calls.
    weights: Vec<f32>,
    /// Working memory of [`top_k_into`].
    scratch: Vec<f32>,
    /// Per-token counts for the penalties; all zero between calls.
    counts: Vec<u32>,
    /// Ids with a non-zero `counts` entry, so penalties and the reset touch
    /// only tokens that occurred rather than the whole vocabulary.
    touched: Vec<u32>,
}

impl Sampler {
    /// A sampler for `params`, seeded from `params.seed` or OS entropy.
    pub fn new(params: &SamplingParams) -> Self {
        let rng = match params.seed {
            Some(seed) => ChaCha8Rng::seed_from_u64(seed),
            None => ChaCha8Rng::from_os_rng(),
        };
        let mut sampler = Sampler {
            params: params.clone(),
            rng,
            min_tokens_mask: Vec::new(),
            raw: Vec::new(),
            cand: Vec::new(),
            weights: Vec::new(),
            scratch: Vec::new(),
            counts: Vec::new(),
            touched: Vec::new(),
        };
        sampler.set_eos_ids(&[]);
        sampler
    }

    /// The model's end-of-sequence ids, masked (with `stop_token_ids`) until
    /// `min_tokens` tokens were generated. With `ignore_eos` they are not
    /// masked, as in vLLM: EOS then does not end the sequence, so there is
    /// nothing to postpone; the engine, not the sampler, implements ignore_eos.
    pub fn set_eos_ids(&mut self, eos_ids: &[u32]) {
        self.min_tokens_mask.clear();
        self.min_tokens_mask
            .extend_from_slice(&self.params.stop_token_ids);
        if !self.params.ignore_eos {
            self.min_tokens_mask.extend_from_slice(eos_ids);
        }
    }

    /// Whether [`Sampler::sample`], after `generated` output tokens, returns
    /// the logits' [`argmax`] and reads nothing else of them: greedy, with no
    /// logprobs, bias or penalties, and no `min_tokens` mask in force. Such a
    /// row can be picked where the logits are, and only its id sent back.
    pub fn argmax_only(&self, generated: usize) -> bool {
        let p = &self.params;
        p.temperature < GREEDY_TEMPERATURE
            && p.logprobs.is_none()
            && p.logit_bias.is_empty()
            && p.repetition_penalty == 1.0
            && p.presence_penalty == 0.0
            && p.frequency_penalty == 0.0
            && (generated >= p.min_tokens || self.min_tokens_mask.is_empty())
    }

    /// Picks the next token from one row of logits (one entry per vocabulary
    /// id), which it modifies in place. `prompt_tokens` and `output_tokens`
    /// feed the penalties and `min_tokens`; ids outside the vocabulary are
    /// ignored.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        prompt_tokens: &[u32],
        output_tokens: &[u32],
    ) -> SampledToken {
        assert!(!logits.is_empty(), "cannot sample from empty logits");
        let scored = self.params.logprobs.map(|n| {
            self.raw.clear();
            self.raw.extend_from_slice(logits);
            let lse = log_sum_exp(logits, &mut self.weights);
            let top = top_logprobs(logits, n, lse, &mut self.cand, &mut self.scratch);
            (lse, top)
        });

        self.apply_processors(logits, prompt_tokens, output_tokens);
        let id = self.pick(logits, None);
        let (logprob, top_logprobs) = match scored {
            Some((lse, top)) => (Some(self.raw[id as usize] - lse), top),
            None => (None, Vec::new()),
        };
        SampledToken {
            id,
            logprob,
            top_logprobs,
        }
    }

    /// The token this sampler would pick from a draft model's `logits`
    /// (modified in place) after `output_tokens`, drawing with `key` in
    /// place of its RNG's next one. Called with the keys the RNG will give
    /// next ([`Sampler::next_keys`]), a draft model's proposals are drawn
    /// with the very keys the target's rows will be sampled with: where the
    /// two models' distributions agree, so do the tokens
    /// ([`crate::sampling::race`]), and a drafted token holds with about
    /// the probability the two share, rather than with the target's
    /// probability of the draft's argmax.
    pub fn propose(
        &mut self,
        logits: &mut [f32],
        prompt_tokens: &[u32],
        output_tokens: &[u32],
        key: u64,
    ) -> u32 {
        self.apply_processors(logits, prompt_tokens, output_tokens);
        self.pick(logits, Some(key))
    }

    /// This row's sampling for the device sampler ([`device`](super::device)):
    /// what [`Sampler::sample`] would apply after `prompt_tokens` and
    /// `output_tokens`, under the grammar's `allowed` bits, with the key it
    /// would draw, drawn now as it would be.
    pub fn device_row(
        &mut self,
        prompt_tokens: &[u32],
        output_tokens: &[u32],
        allowed: Option<Vec<u32>>,
    ) -> DeviceRow {
        let p = &self.params;
        let mut seen: BTreeMap<u32, (bool, u32)> = BTreeMap::new();
        if p.repetition_penalty != 1.0 {
            for &id in prompt_tokens.iter().chain(output_tokens) {
                seen.entry(id).or_default().0 = true;
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for &id in output_tokens {
                seen.entry(id).or_default().1 += 1;
            }
        }
        let key = match p.temperature < GREEDY_TEMPERATURE {
            true => 0,
            false => self.rng.next_u64(),
        };
        let p = &self.params;
        DeviceRow {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            repetition_penalty: p.repetition_penalty,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            key,
            logprobs: p.logprobs,
            bias: p.logit_bias.to_vec(),
            penalties: seen.into_iter().map(|(id, (r, c))| (id, r, c)).collect(),
            banned: match output_tokens.len() < p.min_tokens {
                true => self.min_tokens_mask.clone(),
                false => Vec::new(),
            },
            allowed,
        }
    }

    /// The keys the next `n` draws will take, leaving the RNG where it is.
    pub fn next_keys(&self, n: usize) -> Vec<u64> {
        let mut rng = self.rng.clone();
        (0..n).map(|_| rng.next_u64()).collect()
    }

    /// Step 6: argmax when greedy, else a draw keyed by `key` or, without
    /// it, by the RNG's next key.
    fn pick(&mut self, logits: &[f32], key: Option<u64>) -> u32 {
        if self.params.temperature < GREEDY_TEMPERATURE {
            return argmax(logits);
        }
        // Drawn first, whatever the logits: the device sampler's rows take
        // their keys before their logits exist (`device_row`).
        let key = key.unwrap_or_else(|| self.rng.next_u64());
        let max = max_of(logits);
        if !max.is_finite() {
            // Everything masked, or infinite logits: degenerate but valid.
            return argmax(logits);
        }
        match self.filter(logits, max) {
            Survivors::Dense => race(key, &self.weights, |i| i as u32) as u32,
            Survivors::Sparse => {
                self.weights.clear();
                self.weights.extend(self.cand.iter().map(|c| c.1));
                let cand = &self.cand;
                self.cand[race(key, &self.weights, |i| cand[i].0)].0
            }
        }
    }

    /// Steps 2–5 of the module docs, in place.
    fn apply_processors(&mut self, logits: &mut [f32], prompt: &[u32], output: &[u32]) {
        for &(id, bias) in self.params.logit_bias.iter() {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }

        if self.counts.len() < logits.len() {
            self.counts.resize(logits.len(), 0);
        }
        let penalty = self.params.repetition_penalty;
        if penalty != 1.0 {
            // Each distinct token is penalized once, however often it occurs.
            self.count(prompt.iter().chain(output), logits.len());
            for &id in &self.touched {
                let l = &mut logits[id as usize];
                *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
            }
            self.reset_counts();
        }
        let (presence, frequency) = (self.params.presence_penalty, self.params.frequency_penalty);
        if presence != 0.0 || frequency != 0.0 {
            self.count(output.iter(), logits.len());
            for &id in &self.touched {
                let count = self.counts[id as usize] as f32;
                logits[id as usize] -= presence + frequency * count;
            }
            self.reset_counts();
        }

        if output.len() < self.params.min_tokens {
            for &id in &self.min_tokens_mask {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    fn count<'a>(&mut self, tokens: impl Iterator<Item = &'a u32>, vocab: usize) {
        for &id in tokens.filter(|&&id| (id as usize) < vocab) {
            let c = &mut self.counts[id as usize];
            if *c == 0 {
                self.touched.push(id);
            }
            *c += 1;
        }
    }

    fn reset_counts(&mut self) {
        for id in self.touched.drain(..) {
            self.counts[id as usize] = 0;
        }
    }

    /// Applies temperature, top-k, top-p and min-p, leaving an unnormalized
    /// probability for each surviving token. `max` is the largest logit,
    /// which must be finite. Tokens more than 87 nats (after temperature)
    /// below the best get weight 0 and are dropped too.
    fn filter(&mut self, logits: &[f32], max: f32) -> Survivors {
        let inv_t = 1.0 / self.params.temperature;
        let (k, top_p, min_p) = (self.params.top_k, self.params.top_p, self.params.min_p);
        // Weights are relative to the most likely token, which gets weight 1,
        // so min-p compares them with min_p directly. vLLM applies top-k,
        // top-p, then min-p. Top-p and min-p each keep a most-likely prefix,
        // so min-p goes first (a linear pass that shrinks what top-p sorts)
        // while top-p measures its mass against the top-k total, before
        // min-p: the result is the same intersection of prefixes.
        if k > 0 && k < logits.len() {
            top_k_into(logits, k, &mut self.cand, &mut self.scratch);
            let mut total = 0.0f64;
            for c in &mut self.cand {
                c.1 = fast_exp((c.1 - max) * inv_t);
                total += f64::from(c.1);
            }
            self.cand.retain(|c| c.1 > 0.0 && c.1 >= min_p);
            if top_p < 1.0 {
                self.cand.sort_unstable_by(by_desc);
                truncate_to_mass(&mut self.cand, f64::from(top_p) * total);
            }
            return Survivors::Sparse;
        }
        self.weights.resize(logits.len(), 0.0);
        let total = exp_into(logits, max, inv_t, &mut self.weights);
        if min_p > 0.0 {
            for w in &mut self.weights {
                if *w < min_p {
                    *w = 0.0;
                }
            }
        }
        if top_p >= 1.0 {
            return Survivors::Dense;
        }
        let mass = f64::from(top_p) * f64::from(total);
        let mut m = NUCLEUS_CHUNK;
        loop {
            top_k_into(&self.weights, m, &mut self.cand, &mut self.scratch);
            self.cand.sort_unstable_by(by_desc);
            if truncate_to_mass(&mut self.cand, mass) || m >= self.weights.len() {
                break;
            }
            m *= 4;
        }
        // Min-p's zeros, when the mass was not reached.
        self.cand.retain(|c| c.1 > 0.0);
        Survivors::Sparse
    }
}

/// Where [`Sampler::filter`] left the surviving tokens' weights.
enum Survivors {
    /// In `weights`, indexed by id; dropped tokens weigh 0.
    Dense,
    /// As `(id, weight)` pairs in `cand`.
    Sparse,
}

/// Truncates `cand`, sorted most likely first, to its shortest prefix whose
/// weight reaches `mass`; false (and untouched) if all of it falls short.
fn truncate_to_mass(cand: &mut Vec<(u32, f32)>, mass: f64) -> bool {
    let mut acc = 0.0f64;
    let end = cand.iter().position(|c| {
        acc += f64::from(c.1);
        acc >= mass
    });
    match end {
        Some(i) => {
            cand.truncate(i + 1);
            true
        }
        None => false,
    }
}

/// Fills `out` with the `k > 0` largest `(id, value)` pairs of `values`
/// (ties: lowest id), in no particular order; `scratch` is working memory.
fn top_k_into(values: &[f32], k: usize, out: &mut Vec<(u32, f32)>, scratch: &mut Vec<f32>) {
    out.clear();
    if k >= values.len() {
        out.extend(values.iter().enumerate().map(|(i, &v)| (i as u32, v)));
        return;
    }
    // Of at least 4k blocks, the k-th largest block maximum is a lower bound
    // on the k-th largest value (k blocks each hold a value that large), so
    // only values reaching it need selecting: about k of them, instead of
    // the whole vocabulary.
    let block = (values.len() / (4 * k)).max(1);
    scratch.clear();
    scratch.extend(values.chunks(block).map(max_of));
    let (_, &mut threshold, _) = scratch.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    out.extend(
        values
            .iter()
            .enumerate()
            .filter(|(_, &v)| v >= threshold)
            .map(|(i, &v)| (i as u32, v)),
    );
    if out.len() > k {
        out.select_nth_unstable_by(k - 1, by_desc);
        out.truncate(k);
    }
}

/// Descending by value, ties by ascending id: a total order, so the filters
/// are deterministic for a given input.
fn by_desc(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The `n` most likely tokens of `logits` with their logprobs, most likely
/// first; `lse` is the logits' log-sum-exp.
fn top_logprobs(
    logits: &[f32],
    n: usize,
    lse: f32,
    cand: &mut Vec<(u32, f32)>,
    scratch: &mut Vec<f32>,
) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    top_k_into(logits, n, cand, scratch);
    cand.sort_unstable_by(by_desc);
    cand.iter().map(|&(id, l)| (id, l - lse)).collect()
}

/// How a given (prompt) token scores under `logits`: its logprob and the `n`
/// most likely tokens, as [`Sampler::sample`] reports a sampled one.
pub fn score_token(logits: &[f32], token: u32, n: usize) -> SampledToken {
    let (mut weights, mut cand, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
    let lse = log_sum_exp(logits, &mut weights);
    SampledToken {
        id: token,
        logprob: Some(logits[token as usize] - lse),
        top_logprobs: top_logprobs(logits, n, lse, &mut cand, &mut scratch),
    }
}

/// `ln(sum(exp(logits)))`; `scratch` receives the exponentials.
fn log_sum_exp(logits: &[f32], scratch: &mut Vec<f32>) -> f32 {
    let max = max_of(logits);
    if !max.is_finite() {
        return max;
    }
    scratch.resize(logits.len(), 0.0);
    max + exp_into(logits, max, 1.0, scratch).ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams {
            seed: Some(0),
            ..SamplingParams::default()
        };
        f(&mut p);
        p
    }

    /// Ids surviving the filters of `p` on `logits`, sorted.
    fn survivors(p: &SamplingParams, logits: &[f32]) -> Vec<u32> {
        let mut s = Sampler::new(p);
        let mut ids: Vec<u32> = match s.filter(logits, max_of(logits)) {
            Survivors::Dense => (0..logits.len() as u32)
                .filter(|&i| s.weights[i as usize] > 0.0)
                .collect(),
            Survivors::Sparse => s.cand.iter().map(|c| c.0).collect(),
        };
        ids.sort_unstable();
        ids
    }

    fn ln(probs: &[f64]) -> Vec<f32> {
        probs.iter().map(|p| p.ln() as f32).collect()
    }

    fn softmax(logits: &[f32]) -> Vec<f64> {
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
        let e: Vec<f64> = logits.iter().map(|&l| f64::from(l - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        e.iter().map(|x| x / sum).collect()
    }

    /// Logits for a larger vocabulary with distinct, non-monotonic values.
    fn scrambled(n: usize) -> Vec<f32> {
        (0..n).map(|i| ((i * 7919) % n) as f32 * -0.01).collect()
    }

    #[test]
    fn argmax_only_holds_exactly_while_sampling_reads_just_the_argmax() {
        let greedy = |f: fn(&mut SamplingParams)| {
            params(|p| {
                p.temperature = 0.0;
                f(p)
            })
        };
        assert!(Sampler::new(&greedy(|_| {})).argmax_only(0));
        let reads_more: [(&str, SamplingParams); 6] = [
            ("temperature", params(|p| p.temperature = 0.7)),
            ("logprobs", greedy(|p| p.logprobs = Some(0))),
            (
                "logit_bias",
                greedy(|p| p.logit_bias = vec![(3, 1.0)].into()),
            ),
            ("repetition_penalty", greedy(|p| p.repetition_penalty = 1.1)),
            ("presence_penalty", greedy(|p| p.presence_penalty = 0.5)),
            ("frequency_penalty", greedy(|p| p.frequency_penalty = 0.5)),
        ];
        for (name, p) in &reads_more {
            assert!(!Sampler::new(p).argmax_only(5), "{name}");
        }
        // EOS is masked until min_tokens; under ignore_eos nothing is.
        let mut s = Sampler::new(&greedy(|p| p.min_tokens = 2));
        s.set_eos_ids(&[1]);
        assert!(!s.argmax_only(1) && s.argmax_only(2));
        let mut s = Sampler::new(&greedy(|p| {
            p.min_tokens = 2;
            p.ignore_eos = true
        }));
        s.set_eos_ids(&[1]);
        assert!(s.argmax_only(0));
        // Where it holds, sampling gives the argmax and nothing else.
        let logits = [0.5, 2.0, -1.0, 1.9, 2.0];
        let token = s.sample(&mut logits.clone(), &[1, 3], &[1]);
        assert_eq!((token.id, token.logprob), (argmax(&logits), None));
        assert!(token.top_logprobs.is_empty());
    }

    #[test]
    fn argmax_takes_lowest_id_and_skips_nan() {
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, 1.0, 1.0]), 1);
    }

    #[test]
    fn top_k_keeps_exactly_the_k_largest() {
        let logits = [0.1, 3.0, -1.0, 2.5, 2.9, 0.0, 2.5];
        // 2.5 ties between ids 3 and 6: the lower id wins.
        assert_eq!(survivors(&params(|p| p.top_k = 3), &logits), [1, 3, 4]);
        assert_eq!(survivors(&params(|p| p.top_k = 1), &logits), [1]);
        assert_eq!(survivors(&params(|p| p.top_k = 7), &logits).len(), 7);
        assert_eq!(survivors(&params(|p| p.top_k = 100), &logits).len(), 7);

        // Large vocabularies take the block-maximum shortcut; arrangements
        // where the largest values cluster must not defeat it. (Spreads stay
        // small: tokens e^-87 times less likely than the best are dropped.)
        let n = 5000;
        let arrangements: [Vec<f32>; 4] = [
            scrambled(n),
            (0..n).map(|i| i as f32 * 0.01).collect(),
            (0..n).map(|i| i as f32 * -0.01).collect(),
            (0..n).map(|i| (i % 7) as f32).collect(),
        ];
        for logits in &arrangements {
            for k in [1, 5, 40, 999, n - 1] {
                let mut expected: Vec<u32> = (0..n as u32).collect();
                expected.sort_by(|&a, &b| {
                    let (a_l, b_l) = (logits[a as usize], logits[b as usize]);
                    b_l.total_cmp(&a_l).then(a.cmp(&b))
                });
                expected.truncate(k);
                expected.sort_unstable();
                assert_eq!(survivors(&params(|p| p.top_k = k), logits), expected);
            }
        }
    }

    #[test]
    fn top_p_keeps_smallest_prefix_reaching_mass() {
        let logits = ln(&[0.0625, 0.5, 0.125, 0.25, 0.0625]);
        assert_eq!(survivors(&params(|p| p.top_p = 0.4), &logits), [1]);
        assert_eq!(survivors(&params(|p| p.top_p = 0.7), &logits), [1, 3]);
        assert_eq!(survivors(&params(|p| p.top_p = 0.8), &logits), [1, 2, 3]);
        assert_eq!(survivors(&params(|p| p.top_p = 1.0), &logits).len(), 5);
        // After top-k the mass is measured against the renormalized top-k set:
        // 0.55 <= 0.5 / 0.875, while without top-k 0.5 falls short of 0.55.
        assert_eq!(survivors(&params(|p| p.top_p = 0.55), &logits), [1, 3]);
        assert_eq!(
            survivors(&params(|p| (p.top_k, p.top_p) = (3, 0.55)), &logits),
            [1]
        );
    }

    #[test]
    fn top_p_on_a_large_vocabulary_matches_a_full_sort() {
        let logits: Vec<f32> = scrambled(5000).iter().map(|l| l * 0.1).collect();
        let probs = softmax(&logits);
        let mut order: Vec<usize> = (0..probs.len()).collect();
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
        // The nucleus of 0.9 spans several sorting chunks.
        for top_p in [0.05f32, 0.3137, 0.9] {
            let mut acc = 0.0;
            let n = order
                .iter()
                .position(|&i| {
                    acc += probs[i];
                    acc >= f64::from(top_p)
                })
                .unwrap()
                + 1;
            let mut expected: Vec<u32> = order[..n].iter().map(|&i| i as u32).collect();
            expected.sort_unstable();
            assert_eq!(survivors(&params(|p| p.top_p = top_p), &logits), expected);
        }
    }

    #[test]
    fn min_p_drops_tokens_below_fraction_of_max() {
        let logits = ln(&[0.1, 0.5, 0.025, 0.25, 0.125]);
        // Threshold 0.22 * 0.5 = 0.11.
        assert_eq!(survivors(&params(|p| p.min_p = 0.22), &logits), [1, 3, 4]);
        assert_eq!(survivors(&params(|p| p.min_p = 1.0), &logits), [1]);
        assert_eq!(survivors(&params(|p| p.min_p = 0.0), &logits).len(), 5);
        // With top-p the result is the intersection, top-p's mass being
        // measured before min-p: 0.875 of the total reaches 0.8.
        assert_eq!(
            survivors(&params(|p| (p.min_p, p.top_p) = (0.22, 0.8)), &logits),
            [1, 3, 4]
        );
    }

    #[test]
    fn repetition_penalty_divides_positive_multiplies_negative_once() {
        let mut s = Sampler::new(&params(|p| p.repetition_penalty = 2.0));
        let mut logits = [2.0, -2.0, 1.0, 0.5];
        s.apply_processors(&mut logits, &[0, 9], &[1, 1, 1]);
        // Token 1 occurs three times but is penalized once; 9 is out of vocab.
        assert_eq!(logits, [1.0, -4.0, 1.0, 0.5]);
        assert!(s.counts.iter().all(|&c| c == 0));
    }

    #[test]
    fn presence_and_frequency_penalties_count_output_only() {
        let p = params(|p| (p.presence_penalty, p.frequency_penalty) = (0.5, 0.25));
        let mut s = Sampler::new(&p);
        let mut logits = [1.0; 4];
        s.apply_processors(&mut logits, &[1, 1], &[0, 2, 2, 2]);
        assert_eq!(logits, [1.0 - 0.5 - 0.25, 1.0, 1.0 - 0.5 - 0.75, 1.0]);

        // Negative penalties encourage repetition.
        let p = params(|p| p.presence_penalty = -1.0);
        let mut logits = [0.0; 3];
        Sampler::new(&p).apply_processors(&mut logits, &[], &[2]);
        assert_eq!(logits, [0.0, 0.0, 1.0]);
    }

    #[test]
    fn logit_bias_forces_and_bans_tokens() {
        let p = params(|p| p.logit_bias = vec![(3, 100.0), (9999, 5.0)].into());
        let mut s = Sampler::new(&p);
        for _ in 0..200 {
            let mut logits = vec![0.0; 8];
            assert_eq!(s.sample(&mut logits, &[], &[]).id, 3);
        }
        let p = params(|p| {
            p.temperature = 0.0;
            p.logit_bias = vec![(0, -100.0)].into();
        });
        let mut logits = [5.0, 4.0, 1.0];
        assert_eq!(Sampler::new(&p).sample(&mut logits, &[], &[]).id, 1);
    }

    #[test]
    fn min_tokens_masks_eos_and_stop_ids_until_reached() {
        let p = params(|p| {
            p.temperature = 0.0;
            p.min_tokens = 2;
            p.stop_token_ids = vec![1].into();
        });
        let mut s = Sampler::new(&p);
        s.set_eos_ids(&[0]);
        let logits = [9.0, 8.0, 1.0];
        assert_eq!(s.sample(&mut logits.clone(), &[], &[]).id, 2);
        assert_eq!(s.sample(&mut logits.clone(), &[], &[2]).id, 2);
        assert_eq!(s.sample(&mut logits.clone(), &[], &[2, 2]).id, 0);

        // With ignore_eos EOS is left alone; stop ids are still masked.
        let mut s = Sampler::new(&SamplingParams {
            ignore_eos: true,
            ..p
        });
        s.set_eos_ids(&[0]);
        let mut masked = logits;
        s.apply_processors(&mut masked, &[], &[]);
        assert_eq!(masked, [9.0, f32::NEG_INFINITY, 1.0]);
    }

    #[test]
    fn greedy_picks_argmax_lowest_id_and_ignores_the_seed() {
        let logits = [0.5, 2.0, -1.0, 2.0, 1.9];
        for seed in [1, 2, 3] {
            let mut s = Sampler::new(&params(|p| (p.temperature, p.seed) = (0.0, Some(seed))));
            for _ in 0..5 {
                assert_eq!(s.sample(&mut logits.clone(), &[], &[]).id, 1);
            }
            assert_eq!(s.rng, ChaCha8Rng::seed_from_u64(seed), "RNG was used");
        }
        // Greedy also applies when top-k/top-p are set, and without a seed.
        let p = SamplingParams {
            temperature: 0.0,
            top_k: 3,
            top_p: 0.1,
            ..SamplingParams::default()
        };
        assert_eq!(Sampler::new(&p).sample(&mut logits.clone(), &[], &[]).id, 1);
    }

    fn draws(seed: u64, n: usize) -> Vec<u32> {
        let mut s = Sampler::new(&params(|p| p.seed = Some(seed)));
        let logits = scrambled(1000);
        (0..n)
            .map(|_| s.sample(&mut logits.clone(), &[], &[]).id)
            .collect()
    }

    #[test]
    fn same_seed_same_draws_different_seed_different_draws() {
        assert_eq!(draws(42, 50), draws(42, 50));
        assert_ne!(draws(42, 50), draws(43, 50));
    }

    #[test]
    fn unseeded_samplers_differ() {
        let draw = || {
            let mut s = Sampler::new(&SamplingParams::default());
            let logits = vec![0.0f32; 1000];
            (0..20)
                .map(|_| s.sample(&mut logits.clone(), &[], &[]).id)
                .collect::<Vec<_>>()
        };
        assert_ne!(draw(), draw());
    }

    #[test]
    fn draw_frequencies_match_softmax() {
        const N: usize = 20_000;
        let logits = [0.0f32, 1.0, 2.0, -1.0, 0.5];
        for temperature in [1.0f32, 0.5] {
            let mut s = Sampler::new(&params(|p| p.temperature = temperature));
            let mut hits = [0usize; 5];
            for _ in 0..N {
                hits[s.sample(&mut logits.clone(), &[], &[]).id as usize] += 1;
            }
            let scaled: Vec<f32> = logits.iter().map(|l| l / temperature).collect();
            for (i, p) in softmax(&scaled).into_iter().enumerate() {
                let freq = hits[i] as f64 / N as f64;
                let sigma = (p * (1.0 - p) / N as f64).sqrt();
                assert!(
                    (freq - p).abs() < 4.5 * sigma,
                    "t={temperature} token {i}: frequency {freq} vs probability {p}"
                );
            }
        }
    }

    #[test]
    fn draws_stay_within_filters_on_a_full_vocabulary() {
        let logits = scrambled(49_152);
        let cases = [
            params(|p| (p.top_k, p.top_p, p.temperature) = (50, 0.9, 0.8)),
            params(|p| p.top_p = 0.5),
            params(|p| p.min_p = 0.05),
        ];
        for p in cases {
            let allowed = survivors(&p, &logits);
            assert!((2..1000).contains(&allowed.len()), "{}", allowed.len());
            let mut s = Sampler::new(&p);
            for _ in 0..500 {
                let id = s.sample(&mut logits.clone(), &[], &[]).id;
                assert!(allowed.binary_search(&id).is_ok(), "{id} was filtered out");
            }
        }
    }

    #[test]
    fn proposals_with_the_next_keys_are_the_tokens_sampling_draws() {
        let logits = scrambled(49_152);
        let cases = [
            params(|p| p.temperature = 1.0),
            params(|p| (p.top_k, p.top_p, p.temperature) = (50, 0.9, 0.8)),
            params(|p| (p.top_p, p.frequency_penalty) = (0.5, 0.7)),
            params(|p| p.temperature = 0.0),
        ];
        for p in cases {
            let mut s = Sampler::new(&p);
            let mut output = Vec::new();
            for _ in 0..20 {
                let ahead = s.next_keys(4);
                // Proposing draws nothing from the RNG: the same keys again.
                let mut proposed = output.clone();
                for &u in &ahead {
                    let id = s.propose(&mut logits.clone(), &[], &proposed, u);
                    proposed.push(id);
                }
                assert_eq!(s.next_keys(4), ahead);
                for want in &proposed[output.len()..] {
                    let got = s.sample(&mut logits.clone(), &[], &output).id;
                    assert_eq!(got, *want, "{p:?}");
                    output.push(got);
                }
            }
            let distinct: std::collections::HashSet<_> = output.iter().collect();
            let greedy = p.temperature == 0.0;
            assert_eq!(distinct.len() == 1, greedy, "{distinct:?}");
        }
    }

    #[test]
    fn the_same_key_picks_the_same_token_from_similar_distributions() {
        // Two tokens that swap places near the top, as a draft model and
        // its target often do, and a tail (total variation 0.02): the same
        // key picks the same token but for about that share of keys,
        // whatever order the filters leave the survivors in.
        let target = ln(&[0.05, 0.30, 0.29, 0.20, 0.16]);
        let draft = ln(&[0.05, 0.29, 0.30, 0.20, 0.16]);
        for p in [
            params(|p| p.temperature = 1.0),
            params(|p| p.top_p = 0.99),
            params(|p| p.top_k = 4),
        ] {
            let (mut a, mut b) = (Sampler::new(&p), Sampler::new(&p));
            let n = 4000;
            let same = (0..n)
                .filter(|&key| {
                    a.propose(&mut target.clone(), &[], &[], key)
                        == b.propose(&mut draft.clone(), &[], &[], key)
                })
                .count();
            assert!(same >= n as usize * 96 / 100, "{p:?}: {same} of {n}");
        }
    }

    #[test]
    fn logprobs_come_from_raw_logits() {
        let raw = [1.0f32, 3.0, -2.0, 0.5, 2.0, 2.0];
        let p = params(|p| {
            p.logprobs = Some(3);
            p.repetition_penalty = 1.7;
            p.presence_penalty = 1.0;
            p.logit_bias = vec![(2, 30.0)].into();
            p.temperature = 0.3;
        });
        let expected: Vec<f32> = softmax(&raw).iter().map(|p| p.ln() as f32).collect();
        let mut s = Sampler::new(&p);
        let t = s.sample(&mut raw.clone(), &[1], &[4]);
        // The bias makes token 2 all but certain, yet its raw logprob is reported.
        assert_eq!(t.id, 2);
        assert!((t.logprob.unwrap() - expected[2]).abs() < 1e-5);
        let ids: Vec<u32> = t.top_logprobs.iter().map(|x| x.0).collect();
        assert_eq!(ids, [1, 4, 5]);
        for &(id, lp) in &t.top_logprobs {
            assert!((lp - expected[id as usize]).abs() < 1e-5);
        }
        let mass: f32 = t.top_logprobs.iter().map(|x| x.1.exp()).sum();
        assert!(mass <= 1.0 + 1e-6);

        // logprobs: 0 reports the chosen token's alone; not requested, none.
        let mut s = Sampler::new(&params(|p| (p.temperature, p.logprobs) = (0.0, Some(0))));
        let t = s.sample(&mut raw.clone(), &[], &[]);
        assert!(t.top_logprobs.is_empty());
        assert!((t.logprob.unwrap() - expected[1]).abs() < 1e-5);
        let mut s = Sampler::new(&params(|p| p.temperature = 0.0));
        let t = s.sample(&mut raw.clone(), &[], &[]);
        assert_eq!((t.id, t.logprob, t.top_logprobs.len()), (1, None, 0));
    }
}
