//! librdkafka's log lines, to `tracing` (target `librdkafka`).
//!
//! librdkafka warns (`CONFWARN`) about every experimental property a client
//! is created with. outbox-cdc sets `enable.gapless.guarantee` itself, on
//! purpose (settings.rs): that warning would show at every start of every
//! producer and say nothing an operator can act on, so a healthy start would
//! never be free of WARN lines. It is logged at DEBUG, naming the property.
//! Every other line keeps librdkafka's level, a `CONFWARN` about anything
//! else (a property from `[kafka]`) included.

use rdkafka::config::RDKafkaLogLevel;
use tracing::Level;

/// Experimental properties outbox-cdc sets on purpose.
const OWN_EXPERIMENTAL: [&str; 1] = ["enable.gapless.guarantee"];

/// The level a librdkafka log line is logged at, and the property when it is
/// the expected warning about one of ours.
pub(super) fn classify(
    level: RDKafkaLogLevel,
    facility: &str,
    message: &str,
) -> (Level, Option<&'static str>) {
    if facility == "CONFWARN"
        && let Some(property) = own_experimental(message)
    {
        return (Level::DEBUG, Some(property));
    }
    let level = match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => Level::ERROR,
        RDKafkaLogLevel::Warning => Level::WARN,
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => Level::INFO,
        RDKafkaLogLevel::Debug => Level::DEBUG,
    };
    (level, None)
}

/// librdkafka's text is "[thrd:app]: Configuration property NAME is
/// experimental: ..." (the thread in brackets).
fn own_experimental(message: &str) -> Option<&'static str> {
    let text = match message.strip_prefix('[') {
        Some(threaded) => threaded.split_once("]: ")?.1,
        None => message,
    };
    let rest = text.strip_prefix("Configuration property ")?;
    let (name, rest) = rest.split_once(' ')?;
    rest.starts_with("is experimental")
        .then(|| OWN_EXPERIMENTAL.into_iter().find(|p| *p == name))
        .flatten()
}

/// `ClientContext::log` of the clients created with the producer's
/// properties.
pub(super) fn log(level: RDKafkaLogLevel, facility: &str, message: &str) {
    match classify(level, facility, message) {
        (_, Some(property)) => tracing::debug!(
            target: "librdkafka",
            property,
            "librdkafka: {facility} {message} (expected: outbox-cdc sets it on purpose)"
        ),
        (Level::ERROR, None) => {
            tracing::error!(target: "librdkafka", "librdkafka: {facility} {message}")
        }
        (Level::WARN, None) => {
            tracing::warn!(target: "librdkafka", "librdkafka: {facility} {message}")
        }
        (Level::INFO, None) => {
            tracing::info!(target: "librdkafka", "librdkafka: {facility} {message}")
        }
        (_, None) => tracing::debug!(target: "librdkafka", "librdkafka: {facility} {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As librdkafka 2.12 logs it when a producer is created (seen with the
    /// real broker, tests/it/sink_kafka.rs).
    const GAPLESS: &str = "[thrd:app]: Configuration property enable.gapless.guarantee is experimental: \
        When set to `true`, any error that could result in a gap in the produced message series \
        when a batch of messages fails, will raise a fatal error (ERR__GAPLESS_GUARANTEE) and \
        stop the producer.";

    #[test]
    fn the_warning_about_our_own_experimental_property_is_debug_and_named() {
        assert_eq!(
            classify(RDKafkaLogLevel::Warning, "CONFWARN", GAPLESS),
            (Level::DEBUG, Some("enable.gapless.guarantee"))
        );
        // Without the thread prefix too.
        let bare = GAPLESS.trim_start_matches("[thrd:app]: ");
        assert_eq!(
            classify(RDKafkaLogLevel::Warning, "CONFWARN", bare),
            (Level::DEBUG, Some("enable.gapless.guarantee"))
        );
    }

    #[test]
    fn any_other_configuration_warning_stays_a_warning() {
        for message in [
            // An experimental property of the user's.
            "[thrd:app]: Configuration property some.new.property is experimental: ...",
            // About our property, but not that it is experimental.
            "[thrd:app]: Configuration property enable.gapless.guarantee requires enable.idempotence",
            // A prefix of our property's name is another property.
            "[thrd:app]: Configuration property enable.gapless is experimental: ...",
            "[thrd:app]: Configuration property linger.ms is deprecated",
            // Our property's text after something else.
            "[thrd:app]: note: Configuration property enable.gapless.guarantee is experimental",
        ] {
            assert_eq!(
                classify(RDKafkaLogLevel::Warning, "CONFWARN", message),
                (Level::WARN, None),
                "{message}"
            );
        }
        // The same text from another facility is not the start-up warning.
        assert_eq!(
            classify(RDKafkaLogLevel::Warning, "OTHER", GAPLESS),
            (Level::WARN, None)
        );
    }

    #[test]
    fn other_lines_keep_librdkafkas_level() {
        let cases = [
            (RDKafkaLogLevel::Emerg, Level::ERROR),
            (RDKafkaLogLevel::Alert, Level::ERROR),
            (RDKafkaLogLevel::Critical, Level::ERROR),
            (RDKafkaLogLevel::Error, Level::ERROR),
            (RDKafkaLogLevel::Warning, Level::WARN),
            (RDKafkaLogLevel::Notice, Level::INFO),
            (RDKafkaLogLevel::Info, Level::INFO),
            (RDKafkaLogLevel::Debug, Level::DEBUG),
        ];
        for (rd, expected) in cases {
            assert_eq!(
                classify(rd, "FAIL", "127.0.0.1:19092/1: Connection refused"),
                (expected, None),
                "{rd:?}"
            );
        }
    }
}
