//! The memory behind a hybrid model's recurrent-state slots (see
//! `engine::state_slots`, which decides which sequence holds which slot):
//! the model holds it and reads a slot by the index each sequence slice
//! carries, as it reads the KV pool by block table.

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
    pub fn take(&mut self, slot: u32, fresh: bool) -> candle_core::Result<Vec<f32>> {
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
}
