//! The error of a pool policy that does not parse or names impossible values.

/// A policy file that does not parse or names impossible values.
#[derive(Debug, thiserror::Error)]
pub enum PoolPolicyError {
    /// The TOML is malformed or has unknown keys.
    #[error("pool policy: {0}")]
    Toml(#[from] toml::de::Error),
    /// A byte size field does not parse.
    #[error("pool policy field {field}: {message}")]
    Field {
        /// The field, e.g. `target[0].warm`.
        field: String,
        /// What is wrong with it.
        message: String,
    },
}
