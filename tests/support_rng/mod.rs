//! The randomized tests' generator: a small xorshift, so that a run is reproducible from its
//! seed (printed by each test, and read back from an environment variable).

// Each test binary uses only some of these helpers.
#![allow(dead_code)]

/// A small xorshift. The seed must not be 0.
pub struct Rng(pub u64);

impl Rng {
    /// A number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The run's seed: the environment variable `var` if it is set, else one from the clock (odd,
/// never 0).
pub fn seed(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64 | 1)
        })
}
