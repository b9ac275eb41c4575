//! The clearing policy file as written: serde structs that keep each value's span so that
//! validation can name the line. [`super::clearing`] turns them into checked rules.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use toml::Spanned;

/// The whole file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    pub calibration: Option<Spanned<String>>,
    #[serde(default)]
    pub defaults: RawDefaults,
    #[serde(default, rename = "rule")]
    pub rules: Vec<RawRule>,
}

/// `[defaults]`: values for rules that do not set them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDefaults {
    pub nt_min_extent: Option<Spanned<Scalar>>,
    pub fence_interval: Option<Spanned<Scalar>>,
    pub threads: Option<Spanned<Scalar>>,
}

/// One `[[rule]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub name: Spanned<String>,
    pub vendor: Option<Spanned<String>>,
    pub family: Option<Spanned<u32>>,
    pub models: Option<Spanned<Vec<Spanned<u32>>>>,
    pub model_ranges: Option<Spanned<Vec<Spanned<[u32; 2]>>>>,
    pub steppings: Option<Spanned<Vec<Spanned<u32>>>>,
    pub stepping_ranges: Option<Spanned<Vec<Spanned<[u32; 2]>>>>,
    #[serde(default)]
    pub requires: Vec<Spanned<String>>,
    pub method: Spanned<String>,
    pub nt_min_extent: Option<Spanned<Scalar>>,
    pub fence_interval: Option<Spanned<Scalar>>,
    pub threads: Option<Spanned<Scalar>>,
    pub source: Spanned<String>,
    pub confidence: Option<Spanned<String>>,
}

/// A value that may be written as an integer or a string (`fence_interval = 2097152` or
/// `"2M"`, `threads = 4` or `"all"`); its meaning is checked during validation, where the
/// error can say what the field allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Scalar {
    Int(i64),
    Text(String),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Text(s) => write!(f, "{s:?}"),
        }
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScalarVisitor;

        impl Visitor<'_> for ScalarVisitor {
            type Value = Scalar;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer or a string")
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                i64::try_from(v)
                    .map(Scalar::Int)
                    .map_err(|_| E::custom(format!("{v} is too large")))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Text(v.to_string()))
            }
        }

        deserializer.deserialize_any(ScalarVisitor)
    }
}
