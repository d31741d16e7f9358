//! The server's one source of random bytes. Ids and jitter ([`fill`]) come from the system a
//! block at a time: P10, a system call for every job's few bytes was a thirtieth of an
//! enqueue's CPU, and a block serves dozens. Bytes handed out are wiped from the block, so the
//! process never hands one out twice. Secrets ([`secret`]: tokens, lease tokens) are drawn
//! from the system as they are made, never kept in memory before: a copy of the process (a VM
//! restored twice from one snapshot, a core dump) holds no secret not yet handed out.

use std::cell::RefCell;

/// How many bytes one draw from the system takes.
const BLOCK: usize = 512;

struct Block {
    bytes: [u8; BLOCK],
    /// Where the bytes not yet handed out begin.
    used: usize,
}

thread_local! {
    static BLOCK_OF_THREAD: RefCell<Block> = const { RefCell::new(Block { bytes: [0; BLOCK], used: BLOCK }) };
}

/// Fills `out` with random bytes for a secret, from the system now.
pub fn secret(out: &mut [u8]) -> Result<(), getrandom::Error> {
    getrandom::fill(out)
}

/// Fills `out` with random bytes for an id or jitter, from the system by way of this
/// thread's block.
pub fn fill(out: &mut [u8]) -> Result<(), getrandom::Error> {
    if out.len() > BLOCK / 4 {
        return getrandom::fill(out);
    }
    BLOCK_OF_THREAD.with_borrow_mut(|block| {
        if BLOCK - block.used < out.len() {
            getrandom::fill(&mut block.bytes)?;
            block.used = 0;
        }
        let taken = &mut block.bytes[block.used..block.used + out.len()];
        out.copy_from_slice(taken);
        taken.fill(0);
        block.used += out.len();
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p10_random_bytes_are_handed_out_once_each_across_refills_of_the_block() {
        let mut seen = std::collections::HashSet::new();
        // Past several refills, draws of odd sizes that straddle the block's end.
        for n in 0..400 {
            let mut b = vec![0u8; 5 + n % 11];
            fill(&mut b).expect("randomness");
            assert!(seen.insert(b.clone()), "a draw came out twice: {b:?}");
        }
        let mut big = [0u8; BLOCK];
        fill(&mut big).expect("a draw larger than the block goes to the system");
        assert!(big.iter().any(|b| *b != 0));
        BLOCK_OF_THREAD.with_borrow(|block| {
            assert!(block.bytes[..block.used].iter().all(|b| *b == 0), "handed-out bytes are wiped");
        });
    }
}
