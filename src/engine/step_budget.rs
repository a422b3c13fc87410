//! How many prompt tokens a step may carry beside its decode rows, and how
//! long it may spend encoding images besides ([`StepBudget::encode_slice`]).
//!
//! Every running stream waits for the whole step, so a step that carries a
//! long prefill chunk stalls them all: on a 1B model on two cores a 32-row
//! decode step takes about 0.3 s, and one that also carries 512 prompt
//! tokens about 4 s. The scheduler therefore gives decode rows their token
//! first and asks [`StepBudget`] how many prompt tokens may join them: as
//! many as keep the step within `slowdown` times a decode-only step of the
//! batch those prompts are building (the rows decoding now plus the
//! sequences still in their prompts or waiting, up to `--max-num-seqs`),
//! and never past `--max-num-batched-tokens`.
//!
//! What a step costs is learnt from the steps run ([`CostModel`]): time is
//! about `a + b * tokens`, a the step's fixed cost (reading the weights,
//! sampling, the scheduler) and b each token's. Only `a / b` matters to
//! the answer, so a machine that slows down as a whole (another process
//! taking cores) leaves the budget where it was.
//!
//! Prefill is never starved: a step with prompt work may always take
//! [`StepBudget::floor`] prompt tokens (a sixteenth of
//! `--max-num-batched-tokens`), whatever the model says, so a prompt of L
//! tokens among busy streams gets its first token within about
//! `L / floor` steps of starting, each bounded by
//! `--max-num-batched-tokens` rows. With no decode row in the step there
//! is nobody to stall, and prompts take the whole cap.

use std::time::Duration;

/// `--max-step-slowdown`'s default: a step that carries prompt tokens may
/// take two and a half times a decode-only step of the batch. A stream's
/// slowest token then comes at most 2.5 times its usual gap apart (less
/// the model's error), under the 3x that inter-token p99 over p50 should
/// stay within, while prompts still get 56 tokens a step beside 32 rows
/// of a 1B model on two cores.
pub const DEFAULT_MAX_STEP_SLOWDOWN: f64 = 2.5;

/// Seconds a step with no decode row to protect (or before any step was
/// timed) may spend encoding images: long enough that the encoder's
/// per-chunk overhead is small, short enough that a request arriving or
/// leaving is seen within about a second.
const ENCODE_ALONE_SECONDS: f64 = 1.0;

/// How fast old steps are forgotten: each new step in the same class
/// weighs as much as the last ten or so together.
const DECAY: f64 = 0.9;

/// Below this spread of token counts (relative standard deviation) the
/// steps seen say nothing about the fixed cost `a`, and the model charges
/// everything per token (`a = 0`), which only makes the budget smaller.
const MIN_SPREAD: f64 = 0.1;

/// The prefill floor as a fraction of `--max-num-batched-tokens`: a
/// sixteenth (32 of the default 512). Low enough that the slowdown, not the
/// floor, sets the budget for a busy batch (32 streams of a 1B model: 56
/// prompt tokens a step), high enough that a 4000-token prompt among any
/// number of streams starts within 125 steps.
const FLOOR_DIVISOR: usize = 16;

/// Exponentially weighted least-squares sums of `(tokens, seconds)`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Sums {
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

impl Sums {
    fn add(&mut self, x: f64, y: f64) {
        self.w = self.w * DECAY + 1.0;
        self.x = self.x * DECAY + x;
        self.y = self.y * DECAY + y;
        self.xx = self.xx * DECAY + x * x;
        self.xy = self.xy * DECAY + x * y;
    }

    fn plus(self, o: Sums) -> Sums {
        Sums {
            w: self.w + o.w,
            x: self.x + o.x,
            y: self.y + o.y,
            xx: self.xx + o.xx,
            xy: self.xy + o.xy,
        }
    }
}

/// Step time as a line over the step's tokens, fitted to the steps run,
/// the recent ones weighing more. Decode-only steps and steps with prompt
/// tokens are kept apart and pooled for the fit, so that a long run of
/// one kind does not forget what the other cost: while prompts keep
/// arriving no step is decode-only, and the small-batch end of the line
/// then rests on the last decode-only steps seen.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CostModel {
    decode: Sums,
    mixed: Sums,
}

impl CostModel {
    /// A step of `tokens` in all, `with_prompt` if any were prompt tokens,
    /// took `took`.
    pub fn observe(&mut self, tokens: usize, with_prompt: bool, took: Duration) {
        if tokens == 0 {
            return;
        }
        let sums = if with_prompt {
            &mut self.mixed
        } else {
            &mut self.decode
        };
        sums.add(tokens as f64, took.as_secs_f64());
    }

    /// `a / b`: a step's fixed cost in tokens' cost, where the steps seen
    /// vary enough in size to measure it; `None` before.
    pub fn fixed_in_tokens(&self) -> Option<f64> {
        let s = self.decode.plus(self.mixed);
        let mx = s.x / s.w;
        let spread = s.w > 0.0 && s.xx / s.w - mx * mx >= (MIN_SPREAD * mx).powi(2);
        match self.line() {
            Some((a, b)) if spread && a > 0.0 => Some(a / b),
            _ => None,
        }
    }

    /// Seconds a token's cost, in steps whose fixed cost is `fixed` tokens'
    /// (measured, or assumed where the steps seen cannot tell): the mean
    /// step over its mean tokens plus `fixed`, which is `b` where the fit
    /// measured `a / b` as `fixed`. `None` before any step was timed.
    pub fn token_seconds(&self, fixed: f64) -> Option<f64> {
        let s = self.decode.plus(self.mixed);
        if s.w <= 0.0 {
            return None;
        }
        let (mx, my) = (s.x / s.w, s.y / s.w);
        (my > 0.0 && my.is_finite()).then(|| my / (fixed + mx))
    }

    /// `(a, b)`: seconds a step, and seconds a token; `None` before any
    /// step took measurable time. `a` is never negative and `b` always
    /// positive: where the fit says otherwise (noise, or steps of one size
    /// only), `a` is 0 and `b` the mean time per token.
    pub fn line(&self) -> Option<(f64, f64)> {
        let s = self.decode.plus(self.mixed);
        if s.w <= 0.0 {
            return None;
        }
        let (mx, my) = (s.x / s.w, s.y / s.w);
        if mx <= 0.0 || my <= 0.0 || !my.is_finite() {
            return None;
        }
        let proportional = Some((0.0, my / mx));
        let var = s.xx / s.w - mx * mx;
        if var < (MIN_SPREAD * mx).powi(2) {
            return proportional;
        }
        let b = (s.xy / s.w - mx * my) / var;
        let a = my - b * mx;
        if b > 0.0 && a >= 0.0 {
            Some((a, b))
        } else {
            proportional
        }
    }
}

/// The per-step token budget: decode rows first, prompt tokens in what a
/// bounded slowdown leaves.
#[derive(Debug, Clone, PartialEq)]
pub struct StepBudget {
    /// `--max-num-batched-tokens`: the hard cap on a step's tokens.
    cap: usize,
    /// Most a step with prompt tokens may take, as a multiple of a
    /// decode-only step; `None`: no bound, prompts fill the cap.
    slowdown: Option<f64>,
    cost: CostModel,
}

impl StepBudget {
    /// `slowdown` 0 turns the bound off; otherwise it is at least 1.
    pub fn new(max_num_batched_tokens: usize, slowdown: f64) -> Self {
        StepBudget {
            cap: max_num_batched_tokens,
            slowdown: (slowdown > 0.0).then_some(slowdown.max(1.0)),
            cost: CostModel::default(),
        }
    }

    /// Prompt tokens a step with prompt work may always take.
    pub fn floor(&self) -> usize {
        (self.cap / FLOOR_DIVISOR).max(1)
    }

    /// What the model has learnt so far.
    pub fn cost(&self) -> &CostModel {
        &self.cost
    }

    /// A step with `decode` decode rows and `prompt` prompt tokens took
    /// `took`.
    pub fn observe(&mut self, decode: usize, prompt: usize, took: Duration) {
        self.cost.observe(decode + prompt, prompt > 0, took);
    }

    /// Prompt tokens a step with `decode` decode rows may carry, when the
    /// sequences running and waiting would decode `batch` rows together
    /// once their prompts are in (`batch` below `decode` counts as
    /// `decode`).
    ///
    /// The step's tokens `n` must keep `a + b·n` within `slowdown` times
    /// `a + b·batch`, so `n ≤ (slowdown − 1)·a/b + slowdown·batch`; the
    /// prompt tokens are `n − decode`, at least [`floor`](Self::floor),
    /// and at most what the cap leaves. Before any step was timed, or
    /// with no decode row to protect, the cap is the only bound.
    pub fn prefill_tokens(&self, decode: usize, batch: usize) -> usize {
        let room = self.cap.saturating_sub(decode);
        let (Some(s), Some((a, b)), true) = (self.slowdown, self.cost.line(), decode > 0) else {
            return room;
        };
        let batch = batch.max(decode) as f64;
        let n = (s - 1.0) * a / b + s * batch;
        // The epsilon keeps a fit that lands a hair under a whole token
        // (floating point) from losing it.
        let prompt = (n - decode as f64 + 1e-6).floor().clamp(0.0, room as f64) as usize;
        prompt.max(self.floor()).min(room)
    }

    /// What a step with `decode` decode rows and `prompt` prompt tokens
    /// may spend in the vision encoder besides, when the sequences running
    /// and waiting would decode `batch` rows together: what `slowdown`
    /// times a decode-only step of the batch leaves past the step's own
    /// tokens, `slowdown·(a + b·batch) − (a + b·(decode + prompt))`, never
    /// below 0 (the encoder still runs one chunk a step, so an image is
    /// never starved). With no decode row, no bound, or before any step was
    /// timed, [`ENCODE_ALONE_SECONDS`].
    pub fn encode_slice(&self, decode: usize, batch: usize, prompt: usize) -> EncodeSlice {
        let streams_wait = decode > 0;
        let seconds = match (self.slowdown, self.cost.line()) {
            (Some(s), Some((a, b))) if streams_wait => {
                let batch = batch.max(decode) as f64;
                let own = a + b * (decode + prompt) as f64;
                (s * (a + b * batch) - own).max(0.0)
            }
            _ => ENCODE_ALONE_SECONDS,
        };
        EncodeSlice {
            seconds,
            streams_wait,
        }
    }
}

/// What a step may spend in the vision encoder.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EncodeSlice {
    /// Seconds past which no chunk should end.
    pub seconds: f64,
    /// Whether decode rows wait on the step: the encoder then works in
    /// small chunks, and otherwise in whole stages, its fastest.
    pub streams_wait: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step of `tokens` costing `a + b·tokens` milliseconds.
    fn ms(a: f64, b: f64, tokens: usize) -> Duration {
        Duration::from_secs_f64((a + b * tokens as f64) / 1000.0)
    }

    /// A budget that has seen decode-only steps of 8 to 32 rows and
    /// mixed steps of 100 to 500 tokens, all on the line a + b·tokens ms.
    fn trained(cap: usize, slowdown: f64, a: f64, b: f64) -> StepBudget {
        let mut s = StepBudget::new(cap, slowdown);
        for d in [8, 16, 32, 24] {
            s.observe(d, 0, ms(a, b, d));
        }
        for (d, p) in [(4, 96), (16, 484), (8, 200), (32, 300)] {
            s.observe(d, p, ms(a, b, d + p));
        }
        s
    }

    fn close(x: f64, y: f64) -> bool {
        (x - y).abs() <= 1e-9 + 1e-6 * y.abs()
    }

    #[test]
    fn the_fixed_cost_in_tokens_is_known_only_from_steps_of_several_sizes() {
        let mut c = CostModel::default();
        assert_eq!(c.fixed_in_tokens(), None);
        for _ in 0..5 {
            c.observe(1, false, ms(2.9, 0.93, 1));
        }
        assert_eq!(c.fixed_in_tokens(), None, "one size says nothing of a");
        for t in [3, 9, 5] {
            c.observe(t, false, ms(2.9, 0.93, t));
        }
        let r = c.fixed_in_tokens().unwrap();
        assert!(close(r, 2.9 / 0.93), "{r}");
        let b = c.token_seconds(r).unwrap();
        assert!(close(b, 0.93e-3), "{b}");
    }

    #[test]
    fn a_tokens_cost_follows_the_fixed_cost_assumed() {
        let mut c = CostModel::default();
        assert_eq!(c.token_seconds(4.0), None);
        for _ in 0..5 {
            c.observe(1, false, ms(2.9, 0.93, 1));
        }
        // One-token steps of 3.83 ms, of which 4 parts in 5 are fixed.
        let b = c.token_seconds(4.0).unwrap();
        assert!(close(b, 3.83e-3 / 5.0), "{b}");
    }

    #[test]
    fn the_model_recovers_the_line_it_was_fed() {
        let s = trained(512, 2.5, 40.0, 7.5);
        let (a, b) = s.cost().line().unwrap();
        assert!(close(a, 0.040) && close(b, 0.0075), "{a} {b}");
    }

    #[test]
    fn a_step_with_a_prompt_stays_within_the_slowdown() {
        // a / b = 40 / 7.5: a 32-row decode step costs 280 ms, and 2.5 of
        // that (700 ms) fits 88 tokens: 56 prompt tokens beside 32 rows.
        let s = trained(512, 2.5, 40.0, 7.5);
        let p = s.prefill_tokens(32, 32);
        assert_eq!(p, 56);
        let step = ms(40.0, 7.5, 32 + p).as_secs_f64();
        let decode_only = ms(40.0, 7.5, 32).as_secs_f64();
        assert!(step <= 2.5 * decode_only + 1e-12, "{step} vs {decode_only}");
        assert!(ms(40.0, 7.5, 32 + p + 1).as_secs_f64() > 2.5 * decode_only);
        // A larger multiple lets more in.
        assert_eq!(trained(512, 4.0, 40.0, 7.5).prefill_tokens(32, 32), 112);
    }

    #[test]
    fn the_bound_is_against_the_batch_the_prompts_are_building() {
        // 4 rows decode while 28 more prompts are on their way: the step
        // may cost 2.5 times a 32-row decode step, not a 4-row one.
        let s = trained(512, 2.5, 40.0, 7.5);
        assert_eq!(s.prefill_tokens(4, 32), 84);
        assert_eq!(s.prefill_tokens(4, 0), s.prefill_tokens(4, 4));
    }

    #[test]
    fn prefill_is_never_starved() {
        // Per-token cost dwarfs the fixed one and one row decodes: the
        // slowdown alone would allow a single prompt token a step.
        let s = trained(512, 1.5, 0.0, 10.0);
        assert_eq!(s.floor(), 32);
        assert_eq!(s.prefill_tokens(1, 1), 32);
        // Nor does a slowdown of 1 (no step may be slower) starve it.
        assert_eq!(trained(512, 1.0, 40.0, 7.5).prefill_tokens(200, 200), 32);
        // Tiny caps still leave a token.
        assert_eq!(StepBudget::new(4, 2.5).floor(), 1);
    }

    #[test]
    fn a_long_prompt_among_busy_streams_gets_its_first_token_in_bounded_steps() {
        // 200 streams decode on a machine where prompt tokens are
        // expensive; a 3000-token prompt still finishes within
        // ceil(3000 / floor) steps, each at most the cap.
        let s = trained(512, 1.2, 5.0, 10.0);
        let (mut left, mut steps) = (3000usize, 0);
        while left > 0 {
            let p = s.prefill_tokens(200, 201);
            assert!(p >= s.floor() && 200 + p <= 512);
            left = left.saturating_sub(p);
            steps += 1;
        }
        assert!(steps <= 3000usize.div_ceil(32), "{steps} steps");
    }

    #[test]
    fn never_past_the_cap() {
        // A GPU-like machine: tokens nearly free next to the fixed cost.
        let s = trained(512, 2.5, 40.0, 0.01);
        assert_eq!(s.prefill_tokens(32, 32), 480);
        assert_eq!(s.prefill_tokens(600, 600), 0, "decode rows past the cap");
    }

    #[test]
    fn without_decode_rows_or_a_model_or_a_bound_prompts_fill_the_cap() {
        let s = trained(512, 2.5, 40.0, 7.5);
        assert_eq!(s.prefill_tokens(0, 32), 512, "nobody to stall");
        let fresh = StepBudget::new(512, 2.5);
        assert_eq!(fresh.prefill_tokens(8, 8), 504, "nothing timed yet");
        let off = trained(512, 0.0, 40.0, 7.5);
        assert_eq!(off.prefill_tokens(8, 8), 504, "slowdown 0 is off");
    }

    #[test]
    fn the_encoder_gets_what_the_slowdown_leaves_past_the_step() {
        // a = 40 ms, b = 7.5 ms: a 32-row decode step costs 280 ms, and
        // 2.5 of it 700 ms, so the encoder may add 420 ms beside a
        // decode-only step; prompt tokens take theirs first.
        let s = trained(512, 2.5, 40.0, 7.5);
        assert!(close(s.encode_slice(32, 32, 0).seconds, 0.420));
        assert!(close(s.encode_slice(32, 32, 20).seconds, 0.420 - 0.150));
        // The step stays within the slowdown either way.
        for prompt in [0, 10, 40] {
            let step = ms(40.0, 7.5, 32 + prompt).as_secs_f64();
            let total = step + s.encode_slice(32, 32, prompt).seconds;
            assert!(total <= 2.5 * 0.280 + 1e-9, "{prompt}: {total}");
        }
        // A full prompt budget leaves nothing (the engine still runs a
        // chunk); the batch to be decoding raises the bound.
        assert_eq!(
            s.encode_slice(32, 32, s.prefill_tokens(32, 32) + 5).seconds,
            0.0
        );
        assert!(s.encode_slice(4, 32, 0).seconds > s.encode_slice(4, 4, 0).seconds);
        assert!(s.encode_slice(32, 32, 0).streams_wait);
        // Nobody decoding, nothing timed, or no bound: a fixed slice.
        let alone = s.encode_slice(0, 32, 100);
        assert_eq!(alone.seconds, ENCODE_ALONE_SECONDS);
        assert!(!alone.streams_wait, "whole stages with nobody waiting");
        let fresh = StepBudget::new(512, 2.5);
        assert_eq!(fresh.encode_slice(8, 8, 0).seconds, ENCODE_ALONE_SECONDS);
        let off = trained(512, 0.0, 40.0, 7.5);
        assert_eq!(off.encode_slice(8, 8, 0).seconds, ENCODE_ALONE_SECONDS);
    }

    #[test]
    fn steps_of_one_size_only_charge_everything_per_token() {
        // Every step had 32 tokens: a and b cannot be told apart, so the
        // fixed cost is taken as 0, and the budget is the smaller one.
        let mut s = StepBudget::new(512, 4.0);
        for _ in 0..5 {
            s.observe(32, 0, ms(40.0, 7.5, 32));
        }
        let (a, b) = s.cost().line().unwrap();
        assert!(close(a, 0.0) && close(b, 0.280 / 32.0), "{a} {b}");
        // 4 × 32 = 128 tokens: 96 prompt tokens, where knowing a allows 112.
        assert_eq!(s.prefill_tokens(32, 32), 96);
        assert_eq!(trained(512, 4.0, 40.0, 7.5).prefill_tokens(32, 32), 112);
    }

    #[test]
    fn a_fit_with_negative_cost_falls_back_to_per_token() {
        // Noise: the big steps look cheaper per token than the small ones
        // by more than the fixed cost explains.
        let mut m = CostModel::default();
        m.observe(10, false, Duration::from_millis(300));
        m.observe(100, true, Duration::from_millis(200));
        let (a, b) = m.line().unwrap();
        assert!(close(a, 0.0) && b > 0.0);
        let mut m = CostModel::default();
        m.observe(100, true, Duration::ZERO);
        assert_eq!(m.line(), None, "no time measured yet");
    }

    #[test]
    fn the_model_follows_a_change_of_cost() {
        // The fixed cost doubles (e.g. another process now shares the
        // memory bus): within a few dozen steps the model says so.
        let mut s = trained(512, 3.0, 40.0, 7.5);
        // 2 · 40 / 7.5 + 3 · 32 = 106.7 tokens: 74 beside 32 rows.
        assert_eq!(s.prefill_tokens(32, 32), 74);
        for i in 0..60 {
            let d = 16 + i % 17;
            s.observe(d, 0, ms(80.0, 7.5, d));
            s.observe(d, 100 + 3 * i, ms(80.0, 7.5, d + 100 + 3 * i));
        }
        let (a, b) = s.cost().line().unwrap();
        assert!(
            (a - 0.080).abs() < 0.002 && (b - 0.0075).abs() < 0.0002,
            "{a} {b}"
        );
        // 2 · 80 / 7.5 + 3 · 32 = 117.3 tokens: about 85 beside 32 rows.
        let p = s.prefill_tokens(32, 32);
        assert!((84..=86).contains(&p), "{p}");
    }
}
