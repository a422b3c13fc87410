//! How the CUDA kernel splits rows' keys across blocks (flash-decoding):
//! plain arithmetic, kept apart from the launch so the CPU build tests it.

/// A split row's parts hold at least this many keys, so that merging them
/// costs little beside reading them.
const MIN_PART: usize = 64;

/// Parts per row for a grid of `blocks` blocks (rows times KV-head groups)
/// on `sms` multiprocessors, rows seeing up to `max_context` keys: one
/// where the grid already fills the GPU twice over, else enough to, with
/// parts of at least [`MIN_PART`] keys.
pub fn parts(blocks: usize, sms: usize, max_context: usize) -> usize {
    match blocks >= 2 * sms {
        true => 1,
        false => (2 * sms)
            .div_ceil(blocks.max(1))
            .min(max_context.div_ceil(MIN_PART))
            .max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_only_when_the_grid_leaves_the_gpu_idle() {
        // 64 streams of a 1B model (8 KV heads): 512 blocks fill 132 SMs.
        assert_eq!(parts(64 * 8, 132, 4096), 1);
        // 32 streams: 256 blocks, two parts each.
        assert_eq!(parts(32 * 8, 132, 4096), 2);
        // One stream, 4096 keys: 33 parts of 125 keys.
        assert_eq!(parts(8, 132, 4096), 33);
        // A short context caps the parts at MIN_PART keys each.
        assert_eq!(parts(8, 132, 200), 4);
        assert_eq!(parts(8, 132, 10), 1);
    }
}
