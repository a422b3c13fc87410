//! The memory behind a hybrid model's recurrent-state slots (see
//! `engine::state_slots`, which decides which sequence holds which slot):
//! the model holds it and reads a slot by the index each sequence slice
//! carries, as it reads the KV pool by block table.

use candle_core::{DType, Device, Result, Tensor};

/// The memory behind the slots: `slot_len` f32 per slot, allocated the
/// first time a slot is used (a server's `--max-num-seqs` slots cost
/// nothing until that many sequences run).
#[derive(Debug, Default)]
pub struct StateStore {
    slot_len: usize,
    slots: Vec<Vec<f32>>,
}

impl StateStore {
    pub fn new(slot_len: usize) -> Self {
        StateStore {
            slot_len,
            slots: Vec::new(),
        }
    }

    pub fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// Takes slot `slot`'s state out, to be [`Self::put`] back: zeroed when
    /// `fresh` (a sequence at position 0). An error when a sequence past
    /// position 0 finds a slot that never held a state.
    pub fn take(&mut self, slot: u32, fresh: bool) -> Result<Vec<f32>> {
        let i = slot as usize;
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, Vec::new);
        }
        let mut state = std::mem::take(&mut self.slots[i]);
        match (fresh, state.len() == self.slot_len) {
            (true, true) => state.fill(0.0),
            (true, false) => state = vec![0.0; self.slot_len],
            (false, true) => {}
            (false, false) => candle_core::bail!(
                "state slot {slot} holds no state for a sequence past its start (taken twice in \
                 one step, or lost to a failed step)"
            ),
        }
        Ok(state)
    }

    /// Puts a state taken by [`Self::take`] back in its slot.
    pub fn put(&mut self, slot: u32, state: Vec<f32>) {
        self.slots[slot as usize] = state;
    }
}

/// The same slots on a GPU: one f32 tensor `[slots, slot_len]` that the
/// kernels (`models/gated_delta.cu`) read and update in place, zeroing a
/// fresh sequence's state themselves. It grows (doubling) as higher slots
/// are first used, so that, as on the host, unused slots cost nothing.
#[derive(Debug)]
pub struct DeviceStates {
    slot_len: usize,
    device: Device,
    pool: Option<Tensor>,
    /// Whether each slot holds a state a resumed sequence may carry on
    /// from: cleared while a step runs over it, set when the step ends.
    held: Vec<bool>,
}

impl DeviceStates {
    pub fn new(slot_len: usize, device: &Device) -> Self {
        DeviceStates {
            slot_len,
            device: device.clone(),
            pool: None,
            held: Vec::new(),
        }
    }

    /// Opens a step over `slots` (`(slot, fresh)` per sequence, `fresh` at
    /// position 0), returning the pool, grown to hold every one. Each slot
    /// is marked taken until [`Self::close`]: a step that fails in between
    /// loses its sequences' states, as [`StateStore::take`] without a
    /// `put` does. An error, before anything is marked, when a resumed
    /// sequence's slot holds no state or two sequences share a slot.
    pub fn open(&mut self, slots: &[(u32, bool)]) -> Result<Tensor> {
        let need = slots
            .iter()
            .map(|&(s, _)| s as usize + 1)
            .max()
            .unwrap_or(0);
        if self.held.len() < need {
            self.held.resize(need, false);
        }
        let mut seen = vec![false; need];
        for &(slot, fresh) in slots {
            let i = slot as usize;
            if std::mem::replace(&mut seen[i], true) {
                candle_core::bail!("state slot {slot} is in one step twice");
            }
            if !fresh && !self.held[i] {
                candle_core::bail!(
                    "state slot {slot} holds no state for a sequence past its start (lost to a \
                     failed step)"
                );
            }
        }
        let cap = self.pool.as_ref().map_or(0, |p| p.dim(0).unwrap_or(0));
        if cap < need {
            let grown = need.max(2 * cap);
            let extra = Tensor::zeros((grown - cap, self.slot_len), DType::F32, &self.device)?;
            self.pool = Some(match &self.pool {
                Some(old) => Tensor::cat(&[old, &extra], 0)?,
                None => extra,
            });
        }
        for &(slot, _) in slots {
            self.held[slot as usize] = false;
        }
        match &self.pool {
            Some(pool) => Ok(pool.clone()),
            None => Tensor::zeros((0, self.slot_len), DType::F32, &self.device),
        }
    }

    /// Ends a step that ran: its slots hold their sequences' states.
    pub fn close(&mut self, slots: &[(u32, bool)]) {
        for &(slot, _) in slots {
            self.held[slot as usize] = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_take_starts_from_zero_and_a_resumed_one_from_what_was_put() {
        let mut store = StateStore::new(3);
        let mut s = store.take(5, true).unwrap();
        assert_eq!(s, [0.0; 3]);
        s[1] = 7.0;
        store.put(5, s);
        assert_eq!(store.take(5, false).unwrap(), [0.0, 7.0, 0.0]);
        // Taken and not put back: a resumed sequence cannot carry on.
        assert!(store.take(5, false).is_err());
        assert!(store.take(2, false).is_err(), "never used");
        store.put(5, vec![1.0; 3]);
        assert_eq!(
            store.take(5, true).unwrap(),
            [0.0; 3],
            "reset at position 0"
        );
    }

    #[test]
    fn device_slots_grow_and_a_resumed_sequence_needs_a_closed_step() {
        let mut states = DeviceStates::new(3, &Device::Cpu);
        assert!(states.open(&[(0, false)]).is_err(), "never used");
        let pool = states.open(&[(0, true), (2, true)]).unwrap();
        assert_eq!(pool.dims(), [3, 3]);
        states.close(&[(0, true), (2, true)]);
        // Slot 4 doubles the pool.
        let pool = states.open(&[(2, false), (4, true)]).unwrap();
        assert_eq!(pool.dims(), [6, 3]);
        // That step fails: slot 2 is lost, slot 0 (not in it) is not.
        assert!(states.open(&[(2, false)]).is_err());
        assert!(states.open(&[(0, false)]).is_ok());
        assert!(
            states.open(&[(1, true), (1, true)]).is_err(),
            "one slot twice"
        );
        assert!(
            states.open(&[(2, true)]).is_ok(),
            "a fresh sequence may reuse it"
        );
    }
}
