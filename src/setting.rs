//! The one error of every settings section's validation: a value that is not
//! allowed, named by its dotted config key, with what would be.

use std::fmt;

/// A configuration value that is not allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {key} = {value:?}: {allowed}")]
pub struct InvalidSetting {
    /// Dotted key as written in the config file, e.g. `outbox.topic`.
    pub key: String,
    /// The rejected value, as given.
    pub value: String,
    /// What would have been accepted (and why this was not).
    pub allowed: String,
}

impl InvalidSetting {
    pub fn new(
        key: impl Into<String>,
        value: impl fmt::Display,
        allowed: impl Into<String>,
    ) -> InvalidSetting {
        InvalidSetting {
            key: key.into(),
            value: value.to_string(),
            allowed: allowed.into(),
        }
    }
}

/// `value` as one of `choices` (the word in the config, what it means), or
/// the error naming `key` and listing the words.
pub fn one_of<T: Copy>(key: &str, value: &str, choices: &[(&str, T)]) -> Result<T, InvalidSetting> {
    if let Some((_, choice)) = choices.iter().find(|(word, _)| *word == value) {
        return Ok(*choice);
    }
    let words: Vec<String> = choices
        .iter()
        .map(|(word, _)| format!("{word:?}"))
        .collect();
    Err(InvalidSetting::new(
        key,
        value,
        format!("one of {}", words.join(", ")),
    ))
}

#[cfg(test)]
mod tests {
    use super::InvalidSetting;

    #[test]
    fn display_quotes_the_value() {
        let e = InvalidSetting::new("outbox.topic", "a\"b", "something");
        assert_eq!(
            e.to_string(),
            "invalid outbox.topic = \"a\\\"b\": something"
        );
    }
}
