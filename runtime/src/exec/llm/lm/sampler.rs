//! How [`LanguageModel`](crate::exec::llm::generate::LanguageModel) picks each new token:
//! greedily, or drawn with TVM's `vm.builtin.sample_top_p_from_logits`
//! ([`sample_top_p_from_logits`], bitwise TVM's) from the uniform samples of MLC-LLM's
//! `RandomGenerator` (`cpp/support/random.h`): `std::mt19937` seeded with the sequence's seed
//! and `std::uniform_real_distribution<double>(0, 1)` as libstdc++ computes it (two 32-bit
//! draws, `(x1 + x2 * 2^32) / 2^64`), one per token.

use rand_mt::Mt;

use super::sampling::{sample_top_p_from_logits, SamplingError};
use crate::array::NdArray;
use crate::device::Device;

/// How each new token is picked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// The softmax temperature; 0 (the default) is greedy decoding.
    pub temperature: f64,
    /// The probability mass of the most likely tokens drawn from (1: all of them).
    pub top_p: f64,
    /// The seed of the draws (of the first sequence; sequence `i` of a batch gets `seed + i`).
    pub seed: u32,
}

impl Default for Sampling {
    fn default() -> Sampling {
        Sampling { temperature: 0.0, top_p: 1.0, seed: 0 }
    }
}

impl Sampling {
    /// Whether tokens are picked greedily (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Refuses a temperature that is negative or not finite, and a `top_p` outside (0, 1].
    pub fn check(&self) -> Result<(), SamplingOptionError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SamplingOptionError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingOptionError::TopP(self.top_p));
        }
        Ok(())
    }
}

/// A [`Sampling`] whose settings are out of their domain ([`Sampling::check`]).
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SamplingOptionError {
    /// A temperature that is negative or not finite.
    #[error("the temperature {0} is not a finite number of at least 0 (0: greedy)")]
    Temperature(f64),
    /// A `top_p` outside (0, 1].
    #[error("top_p {0} is not in (0, 1]")]
    TopP(f64),
}

/// The draws of one sequence.
#[derive(Debug)]
pub struct Sampler {
    sampling: Sampling,
    rng: Mt,
}

impl Sampler {
    /// The sampler of a sequence seeded `seed`.
    pub fn new(sampling: &Sampling, seed: u32) -> Sampler {
        Sampler { sampling: *sampling, rng: Mt::new(seed) }
    }

    /// libstdc++'s `std::uniform_real_distribution<double>(0, 1)` over `std::mt19937`
    /// (`std::generate_canonical<double, 53>`: two draws, the sum in `double`, below 1).
    pub fn uniform(&mut self) -> f64 {
        let (lo, hi) = (f64::from(self.rng.next_u32()), f64::from(self.rng.next_u32()));
        let u = (lo + hi * 4_294_967_296.0) / 18_446_744_073_709_551_616.0;
        if u >= 1.0 {
            1.0 - f64::EPSILON / 2.0
        } else {
            u
        }
    }

    /// The token drawn from `logits` (one draw), or `None` when greedy (no draw: the caller
    /// takes the argmax).
    pub fn sample(&mut self, logits: &[f32]) -> Result<Option<i32>, SamplingError> {
        if self.sampling.is_greedy() {
            return Ok(None);
        }
        let u = self.uniform();
        let row = NdArray::from_f32(logits, &[1, logits.len() as i64], Device::cpu(0))?;
        sample_top_p_from_logits(&row, self.sampling.temperature, self.sampling.top_p, u).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_draws_are_libstdcxx_over_mt19937() {
        // std::mt19937's 10000th output for the default seed 5489 is 4123659995 (the C++
        // standard, [rand.predef]).
        let mut mt = Mt::new(5489);
        let x = (0..10_000).map(|_| mt.next_u32()).last();
        assert_eq!(x, Some(4_123_659_995));
        // The first draws of seed 5489 are 3499211612 and 581869302: the uniform sample is
        // their generate_canonical sum over 2^64.
        let mut s = Sampler::new(&Sampling { temperature: 1.0, top_p: 1.0, seed: 5489 }, 5489);
        let want = (3_499_211_612f64 + 581_869_302f64 * 4_294_967_296.0) / 18_446_744_073_709_551_616.0;
        assert_eq!(s.uniform(), want);
    }

    #[test]
    fn sampling_settings_are_checked() {
        assert!(Sampling::default().check().is_ok());
        let e = Sampling { temperature: -1.0, ..Sampling::default() }.check().unwrap_err();
        assert_eq!(e, SamplingOptionError::Temperature(-1.0));
        assert!(e.to_string().contains("temperature -1 is not"), "{e}");
        assert!(matches!(
            Sampling { temperature: f64::NAN, ..Sampling::default() }.check(),
            Err(SamplingOptionError::Temperature(_))
        ));
        assert_eq!(Sampling { top_p: 0.0, ..Sampling::default() }.check(), Err(SamplingOptionError::TopP(0.0)));
        let e = Sampling { top_p: 1.5, ..Sampling::default() }.check().unwrap_err();
        assert_eq!(e.to_string(), "top_p 1.5 is not in (0, 1]");
    }
}
