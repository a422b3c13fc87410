//! The step's sampling stage: each planned row's logits and hidden rows
//! become its [`RowOutput`]. Sampling touches only each sequence's sampler
//! and grammar; what the tokens do to the sequence (its cache cursor, its
//! text, its end) is [`Scheduler::update`](crate::engine::scheduler::Scheduler::update)'s.

use rayon::prelude::*;

use crate::engine::model_runner::{LogitRow, ModelRunner, Pick, Rows, RunnerOutput};
use crate::engine::sequence::{SeqId, Sequence};
use crate::engine::step_plan::{RowOutput, RowPlan};
use crate::models::LogitRows;
use crate::sampling::constraint::TokenMask;
use crate::sampling::sampler::{score_token, SampledToken};

/// A constrained row's mask for the token it is about to sample.
pub type Mask = (SeqId, anyhow::Result<TokenMask>);

/// The grammar masks of the rows about to sample under one; nothing is
/// allocated when there are none.
pub fn grammar_masks(rows: &mut [(&RowPlan, &mut Sequence)]) -> Vec<Mask> {
    rows.par_iter_mut()
        .filter(|(row, _)| row.needs_mask())
        .filter_map(|(_, s)| {
            let id = s.id;
            s.params.constraint.as_mut().map(|c| (id, c.mask()))
        })
        .collect()
}

/// Where each of the step's logits rows is read ([`Pick`]): a plain greedy
/// row's argmax on the device; with `on_device` (a CUDA device), a row that
/// samples one token with no draft or prompt scores is sampled there (its
/// sampler draws the row's key now; under a grammar, once the mask is
/// known: [`sample_held`]); the rest come back whole.
pub fn picks(rows: &mut [(&RowPlan, &mut Sequence)], on_device: bool) -> Vec<Pick> {
    let mut picks = Vec::new();
    for (row, seq) in rows.iter_mut() {
        let n = row.num_logit_rows();
        let sample_here = on_device
            && n == 1
            && row.ends
            && row.draft.is_empty()
            && row.logit_rows() == LogitRows::Last;
        match (row.argmax_only, sample_here, row.masked) {
            (true, _, _) => picks.extend(std::iter::repeat_n(Pick::Argmax, n)),
            (false, true, false) => picks.push(Pick::Sample(seq.device_row())),
            (false, true, true) => picks.push(Pick::SampleMasked(seq.id, seq.device_row())),
            (false, false, _) => picks.extend(std::iter::repeat_n(Pick::Whole, n)),
        }
    }
    picks
}

/// Samples the rows `out` holds on the device for their grammars
/// ([`LogitRow::Held`]) under `masks`, now computed, in place. A row whose
/// mask failed is sampled without one, and [`sample`] reports the failure.
pub fn sample_held(
    runner: &mut ModelRunner,
    mut out: RunnerOutput,
    masks: &[Mask],
) -> RunnerOutput {
    let Ok((logits, _)) = &mut out.rows else {
        return out;
    };
    if !logits.iter().any(|r| matches!(r, LogitRow::Held)) {
        return out;
    }
    let allowed = |id: SeqId, vocab: usize| {
        masks
            .iter()
            .find(|(seq, _)| *seq == id)
            .and_then(|(_, m)| m.as_ref().ok())
            .map(|m| m.allowed_bits(vocab))
    };
    match runner.sample_held(allowed) {
        Ok(tokens) => {
            let mut tokens = tokens.into_iter();
            for row in logits.iter_mut().filter(|r| matches!(r, LogitRow::Held)) {
                match tokens.next() {
                    Some(t) => *row = LogitRow::Sampled(t),
                    None => {
                        out.rows = Err("a held row was not sampled".into());
                        return out;
                    }
                }
            }
        }
        Err(e) => out.rows = Err(format!("sampling on the device failed: {e}")),
    }
    out
}

/// Splits the step's `logits` and `hidden` rows (in batch order) among
/// `rows`, scores prompt tokens where asked, and samples every row that
/// ends its pending tokens, in parallel: each sequence draws from its own
/// RNG, so the order does not matter. A decode row that ran a draft samples
/// its rows in turn while they agree with it ([`verify_draft`]). A
/// constrained row samples under its mask and advances its grammar; one
/// whose grammar fails (the only way a row fails to sample) says so in its
/// output.
pub fn sample(
    rows: Vec<(&RowPlan, &mut Sequence)>,
    logits: Vec<LogitRow>,
    hidden: Rows,
    mut masks: Vec<Mask>,
) -> Vec<RowOutput> {
    let mut logits = logits.into_iter();
    let mut hidden = hidden.into_iter();
    let mut outputs: Vec<RowOutput> = Vec::with_capacity(rows.len());
    let mut targets = Vec::new();
    for (at, (row, seq)) in rows.into_iter().enumerate() {
        let mut mine: Vec<LogitRow> = logits.by_ref().take(row.num_logit_rows()).collect();
        let mut out = RowOutput {
            hidden: hidden.by_ref().take(row.num_hidden_rows()).collect(),
            ..RowOutput::default()
        };
        if row.draft.is_empty() && row.logit_rows() == LogitRows::All {
            out.prompt_logprobs = score_prompt(seq, row.first, &mine);
        }
        outputs.push(out);
        if !row.draft.is_empty() {
            targets.push((at, row, seq, mine, None));
        } else if row.ends {
            if let Some(last) = mine.pop() {
                // Each constrained row takes its mask along.
                let mask = masks
                    .iter()
                    .position(|(id, _)| *id == seq.id)
                    .map(|i| masks.swap_remove(i).1);
                targets.push((at, row, seq, vec![last], mask));
            }
        }
    }
    let results: Vec<(usize, Result<Vec<SampledToken>, String>)> = targets
        .par_iter_mut()
        .map(|(at, row, seq, rows, mask)| {
            let sampled = match &mut rows[..] {
                [one] if row.draft.is_empty() => sample_one(seq, one, mask.take()).map(|t| vec![t]),
                rows => Ok(verify_draft(seq, &row.draft, rows)),
            };
            (*at, sampled)
        })
        .collect();
    for (at, result) in results {
        match result {
            Ok(tokens) => outputs[at].tokens = tokens,
            Err(msg) => outputs[at].failed = Some(msg),
        }
    }
    outputs
}

/// Samples one token for `seq` from `row`, under its grammar's mask when
/// it has one, and advances the grammar past it.
fn sample_one(
    seq: &mut Sequence,
    row: &mut LogitRow,
    mask: Option<anyhow::Result<TokenMask>>,
) -> Result<SampledToken, String> {
    let grammar_error = |e: anyhow::Error| format!("the output grammar failed: {e:#}");
    let mask = mask.transpose().map_err(grammar_error)?;
    let Sequence {
        sampler,
        tokens,
        prompt_len,
        params,
        ..
    } = seq;
    let (prompt, output) = tokens.split_at(*prompt_len);
    let token = match row {
        LogitRow::Logits(row) => {
            if let Some(mask) = mask {
                mask.apply(row);
            }
            sampler.sample(row, prompt, output)
        }
        // A row picked on the device has no grammar (`argmax_suffices`);
        // one sampled there took its mask along (`sample_held`).
        LogitRow::Argmax(id) => SampledToken::plain(*id),
        LogitRow::Sampled(token) => token.clone(),
        LogitRow::Held => return Err("the row was not sampled on the device".into()),
    };
    if let Some(c) = &mut params.constraint {
        if !c.is_finished() {
            c.commit(token.id).map_err(grammar_error)?;
        }
    }
    Ok(token)
}

/// Samples a drafted decode row's logit rows in turn, each seeing the
/// tokens kept before it, while the token sampled is the one `draft`ed:
/// the drafted tokens kept and the first sampled past them, which is
/// pending next. Drafted rows carry no grammar ([`Sequence::may_draft`]).
fn verify_draft(seq: &mut Sequence, draft: &[u32], rows: &mut [LogitRow]) -> Vec<SampledToken> {
    let Sequence {
        sampler,
        tokens,
        prompt_len,
        ..
    } = seq;
    let (prompt, output) = tokens.split_at(*prompt_len);
    let mut output = output.to_vec();
    let mut kept = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter_mut().enumerate() {
        let token = match row {
            LogitRow::Logits(row) => sampler.sample(row, prompt, &output),
            LogitRow::Argmax(id) => SampledToken::plain(*id),
            // Never: a drafted row comes back whole or as its argmax.
            LogitRow::Sampled(token) => token.clone(),
            LogitRow::Held => break,
        };
        let holds = draft.get(i) == Some(&token.id);
        output.push(token.id);
        kept.push(token);
        if !holds {
            break;
        }
    }
    kept
}

/// Scores the prompt tokens that `rows` (logits at positions `first..`)
/// predict and `seq` is still owed, in parallel over the rows.
fn score_prompt(seq: &Sequence, first: usize, rows: &[LogitRow]) -> Vec<SampledToken> {
    let Some(n) = seq.params.prompt_logprobs else {
        return Vec::new();
    };
    // The row at position p predicts token p + 1, so these rows score
    // tokens `first + 1..`; chunks are contiguous, so the owed token is never
    // before them.
    let from = seq.next_scored_prompt_token();
    let to = seq.prompt_len.min(first + rows.len() + 1);
    if from <= first || from >= to {
        return Vec::new();
    }
    let prompt = &seq.tokens[..seq.prompt_len];
    (from..to)
        .into_par_iter()
        .map(|t| match &rows[t - 1 - first] {
            LogitRow::Logits(row) => score_token(row, prompt[t], n),
            // Never: a scoring row comes back whole (`argmax_suffices`,
            // `picks`).
            LogitRow::Argmax(_) | LogitRow::Sampled(_) | LogitRow::Held => {
                SampledToken::plain(prompt[t])
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::params::SamplingParams;
    use crate::sampling::sampler::Sampler;

    /// A sequence whose whole prompt is this step's chunk: it samples.
    fn prefilling(params: SamplingParams) -> Sequence {
        let mut seq = Sequence::new(1, vec![5u32, 6, 7].into(), params, 1 << 20, &[]);
        seq.chunk = seq.len();
        seq
    }

    #[test]
    fn plain_sampled_rows_are_sampled_on_the_device_with_the_key_the_host_would_draw() {
        let sampled = SamplingParams {
            temperature: 0.8,
            seed: Some(9),
            ..Default::default()
        };
        let scored = SamplingParams {
            prompt_logprobs: Some(1),
            ..sampled.clone()
        };
        let greedy = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        let mut seqs = [
            prefilling(sampled.clone()),
            prefilling(scored),
            prefilling(greedy),
        ];
        let plans: Vec<RowPlan> = seqs.iter().map(|s| RowPlan::of(s, 0)).collect();
        let keys = Sampler::new(&sampled).next_keys(2);

        let mut rows: Vec<_> = plans.iter().zip(seqs.iter_mut()).collect();
        let off = picks(&mut rows, false);
        // Off the device: nothing is drawn ahead.
        assert_eq!(rows[0].1.sampler.next_keys(1), keys[..1]);
        let on = picks(&mut rows, true);
        let Pick::Sample(row) = &on[0] else {
            panic!("{:?}", on[0])
        };
        assert_eq!((row.key, row.temperature), (keys[0], 0.8));
        assert_eq!(
            rows[0].1.sampler.next_keys(1),
            keys[1..],
            "the key is spent"
        );
        // The scoring row needs every row of logits; the greedy one its argmax.
        assert_eq!(on[1..4], [Pick::Whole, Pick::Whole, Pick::Whole]);
        assert_eq!(on[4], Pick::Argmax);
        assert_eq!(off[0], Pick::Whole);
        assert_eq!(off.len(), on.len());

        // Under a grammar: held for its mask, with its sequence's id.
        let masked = RowPlan {
            masked: true,
            ..plans[0].clone()
        };
        let mut seq = prefilling(sampled);
        let held = picks(&mut [(&masked, &mut seq)], true);
        assert!(
            matches!(&held[..], [Pick::SampleMasked(1, row)] if row.key == keys[0]),
            "{held:?}"
        );
    }
}
