//! The tuning half and the check half of a dataset. Levers are designed, tuned and compared on the
//! tuning half only; a candidate default is run once on the check half, whose numbers are the ones
//! reported. A question's half follows from its id alone, so every run, stored or new, cuts the
//! same way: it is in the check half when the first byte of sha256(id) is even.

use sha2::{Digest, Sha256};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Half {
    Tuning,
    Check,
}

impl Half {
    /// The half question `id` is in.
    pub fn of(id: &str) -> Half {
        if Sha256::digest(id.as_bytes())[0] % 2 == 0 { Half::Check } else { Half::Tuning }
    }

    pub fn holds(self, id: &str) -> bool {
        Half::of(id) == self
    }

    pub fn name(self) -> &'static str {
        match self {
            Half::Tuning => "tuning",
            Half::Check => "check",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_half_follows_the_first_byte_of_the_ids_sha256() {
        // sha256("a") starts ca (even), sha256("b") 3e (even), sha256("c") 2e (even), sha256("d") 18
        // (even), sha256("e") 3f (odd).
        assert_eq!(Half::of("a"), Half::Check);
        assert_eq!(Half::of("e"), Half::Tuning);
        let ids: Vec<String> = (0..1000).map(|n| format!("q{n}")).collect();
        let check = ids.iter().filter(|id| Half::Check.holds(id)).count();
        assert!((400..600).contains(&check), "about half: {check}");
    }
}
