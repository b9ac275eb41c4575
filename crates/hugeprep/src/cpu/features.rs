//! The CPU features that decide how memory can be cleared.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

/// A CPU feature that a clearing method or a policy rule can depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Feature {
    /// Enhanced `rep movsb`/`rep stosb` (`CPUID.7.0:EBX[9]`).
    Erms,
    /// Fast short `rep movsb` (`CPUID.7.0:EDX[4]`).
    Fsrm,
    /// AVX2 (`CPUID.7.0:EBX[5]`); 32-byte non-temporal stores.
    Avx2,
    /// AVX-512 Foundation (`CPUID.7.0:EBX[16]`); 64-byte non-temporal stores.
    Avx512f,
    /// AVX-512 byte and word instructions (`CPUID.7.0:EBX[30]`).
    Avx512bw,
    /// AVX-512 vector length extensions (`CPUID.7.0:EBX[31]`).
    Avx512vl,
    /// AMD `clzero` (`CPUID.80000008h:EBX[0]`).
    Clzero,
    /// `movdir64b`, 64-byte direct stores (`CPUID.7.0:ECX[28]`).
    Movdir64b,
    /// AMX tile architecture (`CPUID.7.0:EDX[24]`, `amx_tile` in `/proc/cpuinfo`): only
    /// Intel server cores from Sapphire Rapids on have it, so it identifies the core class
    /// when a hypervisor masks the model number.
    Amx,
    /// AVX-512 half-precision arithmetic (`CPUID.7.0:EDX[23]`): Sapphire Rapids and later
    /// Intel server cores.
    Avx512fp16,
}

/// A feature name that is not one of [`Feature::ALL`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown CPU feature {input:?}: expected one of erms, fsrm, avx2, avx512f, avx512bw, avx512vl, clzero, movdir64b, amx, avx512fp16")]
pub struct FeatureError {
    /// What the user wrote.
    pub input: String,
}

impl Feature {
    /// Every feature, in the order reports list them.
    pub const ALL: [Feature; 10] = [
        Feature::Erms,
        Feature::Fsrm,
        Feature::Avx2,
        Feature::Avx512f,
        Feature::Avx512bw,
        Feature::Avx512vl,
        Feature::Clzero,
        Feature::Movdir64b,
        Feature::Amx,
        Feature::Avx512fp16,
    ];

    /// The name used in policies, the CLI and JSON (as in `/proc/cpuinfo`, without
    /// underscores).
    pub const fn name(self) -> &'static str {
        match self {
            Feature::Erms => "erms",
            Feature::Fsrm => "fsrm",
            Feature::Avx2 => "avx2",
            Feature::Avx512f => "avx512f",
            Feature::Avx512bw => "avx512bw",
            Feature::Avx512vl => "avx512vl",
            Feature::Clzero => "clzero",
            Feature::Movdir64b => "movdir64b",
            Feature::Amx => "amx",
            Feature::Avx512fp16 => "avx512fp16",
        }
    }

    const fn bit(self) -> u16 {
        1 << self as u16
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Feature {
    type Err = FeatureError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Feature::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| FeatureError {
                input: s.to_string(),
            })
    }
}

impl Serialize for Feature {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

/// A set of [`Feature`]s. Serializes as a list of names.
///
/// ```
/// use hugeprep::cpu::{Feature, Features};
/// let f = Features::from_iter([Feature::Avx2, Feature::Erms]);
/// assert!(f.has(Feature::Erms) && !f.has(Feature::Clzero));
/// assert!(f.contains_all(Features::from_iter([Feature::Avx2])));
/// assert_eq!(f.to_string(), "erms avx2");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Features {
    bits: u16,
}

impl Features {
    /// No features.
    pub const NONE: Features = Features { bits: 0 };

    /// Whether `feature` is in the set.
    pub const fn has(self, feature: Feature) -> bool {
        self.bits & feature.bit() != 0
    }

    /// Adds `feature` when `present` is true.
    pub fn set(&mut self, feature: Feature, present: bool) {
        if present {
            self.bits |= feature.bit();
        } else {
            self.bits &= !feature.bit();
        }
    }

    /// Whether every feature of `other` is in the set.
    pub const fn contains_all(self, other: Features) -> bool {
        self.bits & other.bits == other.bits
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.bits == 0
    }

    /// The features of `other` that are not in the set.
    pub const fn missing(self, other: Features) -> Features {
        Features {
            bits: other.bits & !self.bits,
        }
    }

    /// The features in the set, in [`Feature::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = Feature> {
        Feature::ALL.into_iter().filter(move |f| self.has(*f))
    }
}

impl FromIterator<Feature> for Features {
    fn from_iter<I: IntoIterator<Item = Feature>>(iter: I) -> Self {
        let mut set = Features::NONE;
        for f in iter {
            set.set(f, true);
        }
        set
    }
}

impl fmt::Display for Features {
    /// Space-separated names, `-` for none.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("-");
        }
        for (i, feature) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            f.write_str(feature.name())?;
        }
        Ok(())
    }
}

impl Serialize for Features {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Feature::ALL {
            assert_eq!(f.name().parse::<Feature>(), Ok(f));
        }
        assert!("avx512".parse::<Feature>().is_err());
    }

    #[test]
    fn set_operations() {
        let mut f = Features::from_iter([Feature::Clzero, Feature::Avx512f]);
        assert_eq!(
            serde_json::to_string(&f).unwrap(),
            r#"["avx512f","clzero"]"#
        );
        let want = Features::from_iter([Feature::Avx512f, Feature::Erms]);
        assert_eq!(f.missing(want), Features::from_iter([Feature::Erms]));
        f.set(Feature::Erms, true);
        assert!(f.contains_all(want));
        f.set(Feature::Erms, false);
        assert!(!f.has(Feature::Erms));
        assert_eq!(Features::NONE.to_string(), "-");
    }
}
