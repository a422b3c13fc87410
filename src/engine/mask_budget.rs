//! How much of a step grammar masks may take.
//!
//! A constrained row's mask is computed on the CPU beside the forward pass,
//! so an expensive grammar (a regex whose lexer blows up, such as
//! `^.*a.{60}$`, costs about a millisecond a token where a JSON schema
//! costs microseconds) would slow every row of the step, not only its own.
//! Each step, the constrained decode rows together may cost at most a
//! share of the last forward pass's time; the rest sit the step out, and
//! those that sat out longest go first next time. When nothing but such
//! rows would run there is nobody to protect, and all of them run.

use std::time::Duration;

/// A constrained decode row about to be scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaskRow {
    /// What its next mask is expected to take.
    pub cost: Duration,
    /// Steps it has sat out in a row.
    pub sat_out: u32,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MaskBudget {
    /// Share of the forward pass's time the masks of one step may take.
    pub share: f32,
}

impl Default for MaskBudget {
    /// A quarter: other rows then slow by about that much at worst.
    fn default() -> Self {
        MaskBudget { share: 0.25 }
    }
}

impl MaskBudget {
    /// Which of `rows` run this step, given the last forward pass took
    /// `forward`; `others` says whether any other row runs beside them.
    /// At least one always runs, so every row makes progress.
    pub fn select(&self, rows: &[MaskRow], forward: Duration, others: bool) -> Vec<bool> {
        if !others {
            return vec![true; rows.len()];
        }
        let budget = forward.mul_f32(self.share);
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(rows[i].sat_out));
        let mut runs = vec![false; rows.len()];
        let mut spent = Duration::ZERO;
        for (k, i) in order.into_iter().enumerate() {
            if k == 0 || spent + rows[i].cost <= budget {
                runs[i] = true;
                spent += rows[i].cost;
            }
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(us: u64, sat_out: u32) -> MaskRow {
        MaskRow {
            cost: Duration::from_micros(us),
            sat_out,
        }
    }

    const FORWARD: Duration = Duration::from_millis(40);

    #[test]
    fn cheap_masks_all_run() {
        let rows = vec![row(6, 0); 64];
        let runs = MaskBudget::default().select(&rows, FORWARD, true);
        assert!(runs.iter().all(|&r| r));
    }

    #[test]
    fn expensive_masks_take_at_most_their_share() {
        // 10 ms of budget: seven 1.4 ms masks fit, the rest wait.
        let rows = vec![row(1400, 0); 32];
        let runs = MaskBudget::default().select(&rows, FORWARD, true);
        assert_eq!(runs.iter().filter(|&&r| r).count(), 7);
    }

    #[test]
    fn those_that_waited_longest_go_first_and_cheap_ones_still_fit() {
        let rows = vec![row(6000, 0), row(6000, 3), row(20, 0), row(6000, 1)];
        let runs = MaskBudget::default().select(&rows, FORWARD, true);
        assert_eq!(runs, vec![false, true, true, false]);
    }

    #[test]
    fn one_always_runs() {
        let rows = vec![row(50_000, 0), row(50_000, 2)];
        let runs = MaskBudget::default().select(&rows, FORWARD, true);
        assert_eq!(runs, vec![false, true]);
    }

    #[test]
    fn with_nobody_else_to_protect_all_run() {
        let rows = vec![row(50_000, 0); 8];
        let runs = MaskBudget::default().select(&rows, FORWARD, false);
        assert!(runs.iter().all(|&r| r));
    }

    #[test]
    fn every_row_gets_its_turn() {
        let mut rows = vec![row(4000, 0); 10];
        let budget = MaskBudget::default();
        let mut ran = [0; 10];
        for _ in 0..20 {
            let runs = budget.select(&rows, FORWARD, true);
            for (i, r) in runs.iter().enumerate() {
                if *r {
                    ran[i] += 1;
                    rows[i].sat_out = 0;
                } else {
                    rows[i].sat_out += 1;
                }
            }
        }
        // Two 4 ms masks a step, 40 turns over 10 rows: four each.
        assert_eq!(ran, [4; 10]);
    }
}
